package latency

import (
	"testing"

	"github.com/tandem-epp/tandem/internal/outcome"
)

// streamOn starts a whole route on key whose prompt is served at once and whose stream
// then produces chunks (the caller advances the clock between them).
func streamOn(r *rig, key string) *outcome.Tracker {
	tr := r.rec.Start(outcome.KindWhole, "", key, 500)
	r.m.Charge(tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: key, Destination: key, Prompt: Prompt{Tokens: 500}, Service: 0.01})
	r.clock.Advance(secs(0.01))
	tr.Chunk(10)
	return tr
}

// A decode pod that stalls mid-decode (a preemption, a recompute, a GPU fault) stops
// producing its streams' chunks. The models see every chunk, so a pod whose streams have been
// silent well beyond their usual gap is busy: its predicted wait and hand-over grow at once,
// long before any request on it ends, and fall back when its chunks come again. A pod whose
// streams keep coming is not touched, nor is one whose silence is explained by a prompt it is
// prefilling (the ledger times that).
func TestStalledDecodePodIsPredictedBusy(t *testing.T) {
	r := newRig(Options{})
	stalled, healthy := "ns/d1:1", "ns/d2:1"
	var on1, on2 []*outcome.Tracker
	for range 4 {
		on1 = append(on1, streamOn(r, stalled))
		on2 = append(on2, streamOn(r, healthy))
	}
	step := func(trs []*outcome.Tracker) {
		for _, tr := range trs {
			tr.Chunk(10)
		}
	}
	// 100 iterations of 10 ms (±1 ms) on both pods: the models learn the usual gap.
	for i := range 100 {
		r.clock.Advance(secs(0.009 + 0.002*float64(i%2)))
		step(on1)
		step(on2)
	}
	f1, f2 := r.m.Forecast(stalled), r.m.Forecast(healthy)
	if f1.Wait() != 0 || f2.Wait() != 0 {
		t.Fatalf("both pods decoding steadily: waits %.3f / %.3f s, want 0", f1.Wait(), f2.Wait())
	}
	hand := f1.Handover(500, 0)
	// The stalled pod's engine stops; the healthy pod goes on.
	for range 5 {
		r.clock.Advance(secs(0.010))
		step(on2)
	}
	f1, f2 = r.m.Forecast(stalled), r.m.Forecast(healthy)
	if f1.Wait() < 0.05 {
		t.Errorf("streams silent for 50 ms (5 usual gaps): wait %.3f s, want at least the 50 ms of silence", f1.Wait())
	}
	if h := f1.Handover(500, 0); h < hand+0.05 {
		t.Errorf("stalled: hand-over %.3f s (was %.3f), want it to include the stall", h, hand)
	}
	if f2.Wait() != 0 {
		t.Errorf("healthy pod: wait %.3f s, want 0", f2.Wait())
	}
	// The stall ends after 300 ms: the wait is gone as soon as the chunks come.
	r.clock.Advance(secs(0.25))
	step(on1)
	if w := waitOf(r, stalled); w != 0 {
		t.Errorf("chunks came again: wait %.3f s, want 0", w)
	}
	// A second stall: the pod is now known to stall for about 300 ms, so as soon as the
	// silence is noticed the rest of such a stall is predicted, not only what has passed.
	r.clock.Advance(secs(0.010))
	step(on1)
	r.clock.Advance(secs(0.030))
	if w := waitOf(r, stalled); w < 0.2 {
		t.Errorf("30 ms into a second stall of a pod whose last stall lasted 300 ms: wait %.3f s, want ≳ 0.27", w)
	}
	step(on1)
	// A prompt charged on the pod explains a silence until its prefill is due.
	tr := r.rec.Start(outcome.KindWhole, "", stalled, 8000)
	r.m.Charge(tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: stalled, Destination: stalled, Prompt: Prompt{Tokens: 8000}, Service: 0.2})
	r.clock.Advance(secs(0.1))
	if w := waitOf(r, stalled); w > 0.1+1e-9 {
		t.Errorf("silent while its prompt prefills (0.1 s of 0.2 s left): wait %.3f s, want the ledger's 0.1", w)
	}
	// Every stream ends: a silent pod with nothing to decode is idle.
	r.clock.Advance(secs(0.1))
	tr.Chunk(10)
	tr.End(nil)
	for _, tr := range on1 {
		tr.End(nil)
	}
	r.clock.Advance(secs(1))
	if w := waitOf(r, stalled); w != 0 {
		t.Errorf("nothing decoding: wait %.3f s, want 0", w)
	}
}

func waitOf(r *rig, key string) float64 {
	f := r.m.Forecast(key)
	return f.Wait()
}

// A silence far beyond any stall (a hung engine, or a stream whose end was never reported)
// adds at most maxStallAhead of busy time: the pod is not predicted busy for minutes.
func TestStallBusyTimeIsBounded(t *testing.T) {
	r := newRig(Options{})
	key := "ns/d1:1"
	var trs []*outcome.Tracker
	for range 2 {
		trs = append(trs, streamOn(r, key))
	}
	for i := range 50 {
		r.clock.Advance(secs(0.009 + 0.002*float64(i%2)))
		for _, tr := range trs {
			tr.Chunk(10)
		}
	}
	r.clock.Advance(secs(600)) // ten minutes without a chunk
	f := r.m.Forecast(key)
	if w := f.Wait(); w <= 1 || w > maxStallAhead+1 {
		t.Errorf("silent for 10 min: wait %.1f s, want busy but at most %.0f s", w, maxStallAhead)
	}
}
