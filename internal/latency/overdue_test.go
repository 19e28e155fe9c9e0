package latency

import (
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/outcome"
)

// A pod whose booked work is past due is busy, not idle: once its oldest charge is overdue,
// its predicted wait stops draining on the clock and grows with how late that charge runs,
// before the late prefill ends; the end then corrects the ledger as before.
func TestOverduePodIsPredictedBusy(t *testing.T) {
	r := newRig(Options{})
	key := "ns/p:1"
	charge := func(s float64) *outcome.Tracker { return r.chargePD(key, s) }
	wait := func() float64 { w, _ := r.m.Prefill(key, Prompt{Tokens: 1}); return w }
	a, b := charge(0.1), charge(0.1)
	r.clock.Advance(secs(0.15)) // a is 50 ms overdue: b still waits behind it
	w1 := wait()
	if w1 < 0.1 {
		t.Fatalf("a 50 ms overdue, b behind it: wait %.3f s, want at least b's 0.1 s", w1)
	}
	r.clock.Advance(secs(0.5)) // both due long ago, neither ended: a stalled engine
	w2 := wait()
	if w2 <= w1 {
		t.Fatalf("0.55 s overdue: wait %.3f s, want more than %.3f s (it grows with the overdue age)", w2, w1)
	}
	if bl, n := r.m.Local(key, r.clock.Now()); bl != w2 || n != 2 {
		t.Errorf("local %.3f / %d, want the wait %.3f / 2 (other replicas see it too)", bl, n, w2)
	}
	// A charge booked on the stalled pod queues behind the overdue work, not from now.
	c := charge(0.1)
	if w3 := wait(); w3 < w2+0.1-1e-9 {
		t.Errorf("one more charge: wait %.3f s, want at least %.3f s", w3, w2+0.1)
	}
	// The stall ends: a's prefill ended 0.55 s late; b and c move by as much.
	a.PrefillEnd(nil, true)
	if w := wait(); !near(w, 0.2, 1e-6) {
		t.Errorf("a ended: wait %.3f s, want 0.2 (b and c, each 0.1 s)", w)
	}
	b.PrefillEnd(nil, true)
	c.PrefillEnd(nil, true)
	if w := wait(); w != 0 {
		t.Errorf("all ended: wait %.3f, want 0", w)
	}
}

// A decode pod whose hand-over is overdue (a prefill ended elsewhere and its first byte has
// not come) is busy: the decode legs routed there queue behind whatever holds it.
func TestOverdueHandoverMakesTheDecodePodBusy(t *testing.T) {
	r := newRig(Options{})
	tr := r.rec.Start(outcome.KindPD, "ns/p:1", "ns/d:1", 1000)
	r.m.Charge(tr.ID(), Charge{Kind: outcome.KindPD, Prefill: "ns/p:1", Destination: "ns/d:1", Prompt: Prompt{Tokens: 1000}, Service: 0.05})
	r.clock.Advance(secs(0.05))
	tr.PrefillEnd(nil, true)
	before := r.m.Forecast("ns/d:1")
	r.clock.Advance(secs(1)) // the hand-over is predicted in milliseconds: a second late
	after := r.m.Forecast("ns/d:1")
	if after.Wait() < 0.5 || after.Handover(1000, 0) < before.Handover(1000, 0)+0.5 {
		t.Errorf("hand-over 1 s overdue: wait %.3f s, hand-over %.3f s (was %.3f); want the pod busy", after.Wait(), after.Handover(1000, 0), before.Handover(1000, 0))
	}
	tr.Chunk(10)
	if f := r.m.Forecast("ns/d:1"); f.Wait() != 0 {
		t.Errorf("first byte came: wait %.3f, want 0", f.Wait())
	}
}

// A route whose events stopped coming is forgotten with its booking: it does not keep the
// pod overdue for ever.
func TestForgottenChargeIsNotOverdueForEver(t *testing.T) {
	r := newRig(Options{})
	tr := r.rec.Start(outcome.KindWhole, "", "ns/a:1", 1000)
	r.m.Charge(tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: "ns/a:1", Destination: "ns/a:1", Prompt: Prompt{Tokens: 1000}, Service: 0.1})
	r.clock.Advance(routeTTL + time.Minute)
	r.m.Sweep()
	if w, _ := r.m.Prefill("ns/a:1", Prompt{Tokens: 1}); w != 0 {
		t.Errorf("forgotten route: wait %.3f s, want 0", w)
	}
	if _, n := r.m.Local("ns/a:1", r.clock.Now()); n != 0 {
		t.Errorf("forgotten route: %d charges, want 0", n)
	}
}
