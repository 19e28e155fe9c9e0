package pd

import (
	"testing"

	"github.com/tandem-epp/tandem/internal/picker"
)

// A combined decision counts the request as running on its pod from the pick; when the
// gateway reports that a fallback served it, the count moves to the fallback and the
// completion feeds the fallback's drain rate, as for a PD pair's decode fallbacks.
// Worked by hand: two combined pods, no complete roleset → combined_no_roleset with one
// fallback; after the fallback answers, running is {primary 0, fallback 1}; after Done,
// {0, 0} with one completion (1/60 per second) on the fallback only.
func TestCombinedServedFallbackIsCounted(t *testing.T) {
	h := newHarness(t, gateway(nil), C("c1", ""), C("c2", ""))
	d := h.mustPick(prompt("x", 8))
	if d.Outcome != picker.OutcomeCombined || len(d.Destination) != 2 {
		t.Fatalf("outcome %s destination %v", d.Outcome, names(d.Destination))
	}
	prim, fb := d.Destination[0].Key(), d.Destination[1].Key()
	running := func() [2]int64 { return [2]int64{h.deps.Running.InFlight(prim), h.deps.Running.InFlight(fb)} }
	if got := running(); got != [2]int64{1, 0} {
		t.Fatalf("after pick running %v, want [1 0]", got)
	}
	d.Lifecycle.ResponseHeaders(200, d.Destination[1])
	if got := running(); got != [2]int64{0, 1} {
		t.Fatalf("after the fallback answered running %v, want [0 1]", got)
	}
	d.Lifecycle.Done(nil)
	if got := running(); got != [2]int64{0, 0} {
		t.Fatalf("after done running %v, want [0 0]", got)
	}
	if p, f := h.deps.Drain.PerSecond(prim), h.deps.Drain.PerSecond(fb); p != 0 || f != 1.0/60 {
		t.Fatalf("drain primary %v fallback %v, want 0 and 1/60", p, f)
	}
}
