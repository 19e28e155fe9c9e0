package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/sim"
)

// busy occupies a decode pod with long-running requests sent straight to it (not through
// Tandem): each holds promptTokens+1 KV tokens and a running slot until release.
type busy struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func makeBusy(t *testing.T, p *pod, n, promptTokens int) *busy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b := &busy{cancel: cancel}
	t.Cleanup(b.release)
	c := newClient()
	c.Timeout = 0 // held until release
	for i := 0; i < n; i++ {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			// X-Sim-Fault: hang computes the prefill, then holds the sequence (KV and a
			// running slot) without answering until the client leaves.
			post(ctx, c, p.URL(), "/v1/chat/completions", chatBody(prompt(fmt.Sprintf("busy-%s-%d", p.name, i), promptTokens), 1, false),
				map[string]string{sim.HeaderFault: "hang"})
		}()
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if _, err := p.WaitStats(wctx, func(st sim.Stats) bool { return st.Running == n }); err != nil {
		b.release()
		t.Fatalf("making %s busy: %v (stats %+v)", p.name, err, p.Stats())
	}
	return b
}

// release ends the held requests and waits for them; calling it again is harmless.
func (b *busy) release() {
	b.cancel()
	b.wg.Wait()
}

// 6. Engine metrics scraped from the simulators move the picks. Two rolesets; one decode pod
// is loaded with long-running requests sent straight to it. Once Tandem's scraper reports that
// pod's vllm:num_requests_running and vllm:kv_cache_usage_perc, new requests avoid it. The
// load then moves to the other decode pod and the picks follow it, so the test fails if the
// picks ignore the metrics (a fixed or random choice cannot pass both halves).
func TestScrapedMetricsMovePicks(t *testing.T) {
	// A small KV cache so a few requests fill most of it: 16384 tokens, 3 × 4500 held = 82 %.
	p := sim.DefaultParams()
	p.KVTokens = 16384
	specs := pdPods("a", "b")
	for i := range specs {
		if specs[i].role == sim.RoleDecode {
			specs[i].params = &p
		}
	}
	// Only the scraped signals decide here: the throughput-spread shortcut (step 2 of the
	// cascade) is pushed out of reach, so the load_balancing score, which divides by the
	// scraped free KV, makes the choice.
	s := newFileStack(t, map[string]string{"AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD": "1000000000"}, specs...)
	ctx := testCtx(t, 90*time.Second)
	addr := s.tandem.MetricsAddr()

	// Warm both decode pods through the gateway (a subset hint pins each), so Tandem has
	// counted both and neither gets the cold-start score.
	for _, rs := range []string{"a", "b"} {
		hint := s.pods["prefill-"+rs].HostPort() + "," + s.pods["decode-"+rs].HostPort()
		m := s.marker("warm")
		if r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 50), 4, false), map[string]string{subsetHeader: hint}); r.pod != "decode-"+rs {
			t.Fatalf("warm-up of rs-%s: %v", rs, r)
		}
	}

	for _, tc := range []struct{ busy, free string }{{"decode-b", "decode-a"}, {"decode-a", "decode-b"}} {
		busyPod := s.pods[tc.busy]
		load := makeBusy(t, busyPod, 3, 4500)
		labels := map[string]string{"pod_name": tc.busy}
		waitMetric(t, addr, "tandem_endpoint_running_requests", labels, func(v float64) bool { return v == 3 },
			"Tandem's scraper to report vllm:num_requests_running=3 on "+tc.busy)
		kv := waitMetric(t, addr, "tandem_endpoint_kv_cache_usage_ratio", labels, func(v float64) bool { return v > 0.8 },
			"Tandem's scraper to report vllm:kv_cache_usage_perc > 0.8 on "+tc.busy)
		// Throughput is derived from two scrapes: let every pod be scraped twice more, so no
		// sample still counts tokens generated before this phase.
		waitScrapes(t, addr, 2*len(s.pods))

		counts := map[string]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		var failed []string
		for w := 0; w < 3; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					m := s.marker("pick")
					r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 50), 8, false), nil)
					mu.Lock()
					if r.err != nil || r.status != http.StatusOK {
						failed = append(failed, r.String())
					}
					counts[r.pod]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		load.release()
		if len(failed) > 0 {
			t.Fatalf("%d requests failed, first: %s", len(failed), failed[0])
		}
		t.Logf("%s busy (KV %.2f, 3 running): picks %v", tc.busy, kv, counts)
		if counts[tc.busy] > 3 || counts[tc.free] < 57 {
			t.Errorf("%s busy: %d of 60 requests went to it and %d to %s; want ≤ 3 and ≥ 57", tc.busy, counts[tc.busy], counts[tc.free], tc.free)
		}
		// The load is gone: wait until the scraper sees the pod idle again.
		waitMetric(t, addr, "tandem_endpoint_running_requests", labels, func(v float64) bool { return v == 0 },
			"Tandem's scraper to report "+tc.busy+" idle again")
	}
}
