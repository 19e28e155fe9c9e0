package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/sim"
)

// outcome is one request of a traffic run.
type outcome struct {
	marker string
	epoch  int64 // the run's epoch when the request was sent
	r      reply
}

// traffic sends requests through the gateway from workers goroutines until stop is called.
type traffic struct {
	s       *stack
	epoch   atomic.Int64
	mu      sync.Mutex
	results []outcome
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func startTraffic(ctx context.Context, s *stack, workers, tokens, maxTokens int) *traffic {
	ctx, cancel := context.WithCancel(ctx)
	tr := &traffic{s: s, cancel: cancel}
	for w := 0; w < workers; w++ {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			for ctx.Err() == nil {
				m := s.marker("load")
				ep := tr.epoch.Load()
				r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, tokens), maxTokens, false), nil)
				if ctx.Err() != nil && r.err != nil {
					return // stopped while in flight: not a result
				}
				tr.mu.Lock()
				tr.results = append(tr.results, outcome{marker: m, epoch: ep, r: r})
				tr.mu.Unlock()
			}
		}()
	}
	return tr
}

// finished counts the requests sent in epoch that have finished.
func (tr *traffic) finished(epoch int64) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, o := range tr.results {
		if o.epoch == epoch {
			n++
		}
	}
	return n
}

// stop ends the run and returns every finished request; calling it again is harmless.
func (tr *traffic) stop() []outcome {
	tr.cancel()
	tr.wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]outcome(nil), tr.results...)
}

// 3. A decode pod dies mid-traffic and is removed from the endpoints file: its roleset drops
// out (incomplete, so skipped) and requests keep succeeding on the other roleset. Requests in
// flight when it died may fail; none sent after Tandem reloaded the pool may.
func TestDecodePodKilledMidTraffic(t *testing.T) {
	s := newFileStack(t, nil, pdPods("a", "b")...)
	ctx := testCtx(t, 60*time.Second)
	// 40 output tokens at 10 ms (model) each, time scale 0.02: ~8 ms per request, so some
	// are always in flight on each decode pod.
	tr := startTraffic(ctx, s, 4, 100, 40)
	t.Cleanup(func() { tr.stop() })

	// Mid-traffic: both rolesets have served, then decode-b crashes.
	for _, n := range []string{"decode-a", "decode-b"} {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := s.pods[n].WaitRequest(wctx, func(r sim.Recorded) bool { return r.Seq >= 20 }) // each request is recorded twice (sidecar)
		cancel()
		if err != nil {
			tr.stop()
			t.Fatalf("%s did not get traffic: %v", n, err)
		}
	}
	tr.epoch.Store(1) // sent from here on: may meet the crash
	s.pods["decode-b"].Crash()
	s.setPool("prefill-a", "decode-a", "prefill-b")
	tr.epoch.Store(2) // sent from here on: Tandem has the new pool
	prefillB := countReceived(s.pods["prefill-b"])
	eventually(t, "60 requests sent after the reload to finish", func() (bool, string) {
		n := tr.finished(2)
		return n >= 60, fmt.Sprintf("%d finished", n)
	})
	results := tr.stop()

	var okBefore, failBefore, okDuring, failDuring, okAfter int
	for _, o := range results {
		good := okCompletion(o.r, false) == nil
		switch {
		case o.epoch == 0 && good:
			okBefore++
		case o.epoch == 0:
			failBefore++
		case o.epoch == 1 && good:
			okDuring++
		case o.epoch == 1:
			failDuring++
		case good:
			okAfter++
			if o.r.pod != "decode-a" {
				t.Errorf("request %s after the reload answered by %q, want decode-a", o.marker, o.r.pod)
			}
		default:
			t.Errorf("request %s sent after the reload failed: %v", o.marker, o.r)
		}
	}
	t.Logf("before the crash: %d ok, %d failed; between crash and reload: %d ok, %d failed; after the reload: %d ok",
		okBefore, failBefore, okDuring, failDuring, okAfter)
	if okAfter < 60 {
		t.Errorf("only %d requests succeeded after the reload, want ≥ 60", okAfter)
	}
	// The only failures allowed are requests that were on (or routed to) the dead pod: at
	// most the 4 in flight before the crash plus what was sent before the reload.
	if failBefore > 4 {
		t.Errorf("%d requests sent before the crash failed; at most the 4 in flight may", failBefore)
	}
	if got := countReceived(s.pods["prefill-b"]); got != prefillB {
		t.Errorf("prefill-b (roleset without decode) received %d prefill legs after the reload", got-prefillB)
	}
	// The survivors are untouched and the dead roleset is reported incomplete.
	addr := s.tandem.MetricsAddr()
	waitMetric(t, addr, "tandem_pd_rolesets", map[string]string{"state": "incomplete"}, func(v float64) bool { return v == 1 }, "rs-b reported incomplete")
}
