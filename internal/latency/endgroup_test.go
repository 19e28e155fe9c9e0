package latency

import (
	"testing"
	"time"
)

// An iteration's group, alone: it starts at the earliest start of its prompts, is timed from
// its earliest pick (with the work booked ahead of that one), ends at its last end, and tells
// the overlap only when every end in it was observed where it ran with nothing unseen.
func TestEndGroupAdd(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(secs(s)) }
	a := &route{picked: at(0.2), ahead: 0.3, service: 0.1, prompt: Prompt{Tokens: 100}}
	b := &route{picked: at(0.1), ahead: 0.5, service: 0.3, prompt: Prompt{Tokens: 300}}
	unseen := &route{picked: at(0.3), ahead: 0, service: 0.2, unseenHist: true}

	var g endGroup
	if f := g.add(at(1), at(0.6), a, fitObserved, 0); f != fitObserved {
		t.Fatalf("fit %v, want observed", f)
	}
	g.add(at(1.001), at(0.4), b, fitObserved, 0.01)
	if g.start != at(0.4) || g.firstPick != at(0.1) || g.firstAhead != 0.5 || g.last != at(1.001) || g.lastAdj != 0.01 {
		t.Errorf("group from %v, first pick %v with %.1f s ahead, last %v (%.2f s hand-over), want t0+0.4, t0+0.1, 0.5, t0+1.001, 0.01",
			g.start.Sub(t0), g.firstPick.Sub(t0), g.firstAhead, g.last.Sub(t0), g.lastAdj)
	}
	if !near(g.predicted, 0.4, 1e-12) || len(g.items) != 2 || g.overlapUnknown {
		t.Errorf("predicted %.2f over %d (overlap unknown %v), want 0.4 over 2, known", g.predicted, len(g.items), g.overlapUnknown)
	}
	if f := g.add(at(1.002), at(0.5), unseen, fitObserved, 0); f != fitNone || !g.overlapUnknown {
		t.Errorf("an end behind unseen work: fit %v (overlap unknown %v), want none, unknown", f, g.overlapUnknown)
	}
	var h endGroup
	h.add(at(1), at(0.6), a, fitInferred, 0.02)
	if !h.overlapUnknown {
		t.Errorf("an inferred end told the overlap")
	}
}
