package latency

import (
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/outcome"
)

// An engine at its limit of running requests (vLLM's max-num-seqs) reports requests waiting
// while the same number run, scrape after scrape. The models learn that limit, and a request
// sent to a pod with more requests than slots is predicted to wait for running ones to end:
// in its TTFT when it runs whole there, in the hand-over when it is a decode leg. An engine
// whose waiting requests come with a changing number running (a prefill budget, not slots),
// one that later runs more than the supposed limit, and a pod that only prefills are not
// given a slot wait.
func TestSlotWaitOfAnEngineAtItsLimit(t *testing.T) {
	decoded := func(r *rig, key string) {
		for range 3 { // streams of 40 chunks, 10 ms apart: the pod decodes for 0.4 s a request
			tr := streamOn(r, key)
			for range 40 {
				r.clock.Advance(secs(0.01))
				tr.Chunk(10)
			}
			tr.End(nil)
		}
	}
	load := func(r *rig, key string, n int) {
		for range n {
			r.rec.Start(outcome.KindWhole, "", key, 100)
		}
	}
	sample := func(r *rig, key string, running, waiting float64) {
		r.clock.Advance(time.Second)
		r.m.Ingest(key, &metrics.Sample{UpdatedAt: r.clock.Now(), Running: running, HasRunning: true, Waiting: waiting, HasWaiting: true})
	}
	for _, c := range []struct {
		name     string
		decodes  bool
		running  []float64 // one sample each, 4 waiting
		slotWait bool
	}{
		{name: "at its limit", decodes: true, running: []float64{16, 16, 16}, slotWait: true},
		{name: "two samples only", decodes: true, running: []float64{16, 16}},
		{name: "a changing number running", decodes: true, running: []float64{16, 14, 16, 15}},
		{name: "more than the limit later", decodes: true, running: []float64{16, 16, 16, 18}},
		{name: "a pod that only prefills", running: []float64{1, 1, 1, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(Options{})
			key := "ns/d:1"
			if c.decodes {
				decoded(r, key)
			}
			load(r, key, 20)
			before := r.m.Forecast(key)
			for _, n := range c.running {
				sample(r, key, n, 4)
			}
			f := r.m.Forecast(key)
			if !c.slotWait {
				// (the hand-over's first step moves a little with the number running)
				if f.Wait() != before.Wait() || !near(f.Handover(500, 0), before.Handover(500, 0), 0.05) {
					t.Errorf("wait %.3f → %.3f s, hand-over %.3f → %.3f s; want both unchanged", before.Wait(), f.Wait(), before.Handover(500, 0), f.Handover(500, 0))
				}
				return
			}
			// 20 requests on the pod, 16 slots: a new one waits for 5 to end, each decoding
			// about 0.4 s (the mean moves towards what the streams showed): 5 × 0.4 / 16 at least.
			if want := 5 * 0.4 / 16; !(f.Wait() >= want) {
				t.Errorf("wait %.3f s (before the samples %.3f); want at least %.3f for a slot", f.Wait(), before.Wait(), want)
			}
			if h, h0 := f.Handover(500, 0), before.Handover(500, 0); !(h >= h0+5*0.4/16) {
				t.Errorf("hand-over %.3f s (before %.3f); want the slot wait added", h, h0)
			}
			// Waiting for a slot is no prefill work: the TPOT predicted there and the delay a
			// prompt booked there adds are those of a twin pod whose engine reports none waiting.
			twin := newRig(Options{})
			decoded(twin, key)
			load(twin, key, 20)
			for _, n := range c.running {
				sample(twin, key, n, 0)
			}
			ft := twin.m.Forecast(key)
			if tp, tp0 := f.TPOT(500, 0), ft.TPOT(500, 0); tp != tp0 {
				t.Errorf("TPOT %.4f s, %.4f with none waiting: the slot wait was taken for prefill load", tp, tp0)
			}
			if d, d0 := f.Delay(0.1), ft.Delay(0.1); d != d0 {
				t.Errorf("delay %.4f s, %.4f with none waiting: the slot wait was taken for prefill work", d, d0)
			}
			if ft.Wait() != 0 {
				t.Errorf("none waiting: wait %.3f s, want 0", ft.Wait())
			}
			// Once the requests end, nothing waits for a slot.
			r2 := newRig(Options{})
			decoded(r2, key)
			for range 3 {
				sample(r2, key, 16, 4)
			}
			sample(r2, key, 10, 0)
			if f2 := r2.m.Forecast(key); f2.Wait() != 0 {
				w := f2.Wait()
				t.Errorf("10 running, none waiting: wait %.3f s, want 0", w)
			}
		})
	}
}
