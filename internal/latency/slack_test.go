package latency

import (
	"math"
	"testing"
)

// A decoding request's stall budget is (objective − TPOT)·(max_tokens − 1), at least one
// token's worth; the room is the tightest budget less the stall imposed since it was given.
func TestDecodeSlackBudget(t *testing.T) {
	for _, c := range []struct {
		name            string
		objective, tpot float64
		maxTokens       int
		want            float64
	}{
		{"50 ms objective at 10 ms, 6 tokens: 0.04·5", 0.05, 0.01, 6, 0.2},
		{"no max_tokens: 256 assumed, 0.04·255", 0.05, 0.01, 0, 10.2},
		{"one token: one gap's worth", 0.05, 0.01, 1, 0.04},
		{"already slower than its objective: no room", 0.05, 0.06, 10, 0},
		{"no objective: no budget", 0, 0.01, 10, math.Inf(1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var d decodeSlack
			d.willDecode(&routeLife{}, c.objective, c.tpot, c.maxTokens, 1)
			if got := d.room(); !(got == c.want || near(got, c.want, 1e-9)) {
				t.Errorf("room %.4f, want %.4f", got, c.want)
			}
		})
	}
}

// Budgets are keyed at the stall already imposed when they are given: a stall before a
// request starts decoding does not take from its room, one after does; an ended request's
// budget no longer counts.
func TestDecodeSlackRoom(t *testing.T) {
	var d decodeSlack
	tight, loose := &routeLife{}, &routeLife{}
	d.stall(1)                              // before either: not theirs
	d.willDecode(tight, 0.05, 0.01, 6, 2)   // 0.2 s
	d.willDecode(loose, 0.05, 0.01, 101, 2) // 4 s
	d.stall(0.05)
	if got := d.room(); !near(got, 0.15, 1e-9) {
		t.Errorf("room %.4f, want 0.2 − 0.05", got)
	}
	tight.gone = true
	if got := d.room(); !near(got, 3.95, 1e-9) {
		t.Errorf("room %.4f after the tight one ended, want 4 − 0.05", got)
	}
	loose.gone = true
	if got := d.room(); !math.IsInf(got, 1) {
		t.Errorf("room %v with none decoding, want +Inf", got)
	}
}
