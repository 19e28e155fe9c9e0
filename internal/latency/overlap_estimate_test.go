package latency

import (
	"testing"
	"time"
)

// The overlap estimate alone, fed iterations whose last end came observed = c·(s + k·ahead)
// after the first pick (c: how slow the pod is against its prefill model): the regression finds
// k exactly, whatever c, once the gate is open (enough iterations with work ahead, enough
// overtakes), and 1 otherwise.
func TestOverlapEstimateShare(t *testing.T) {
	// Prompts of 0.1–0.4 s behind 0–0.9 s of work, varied apart from each other.
	feed := func(o *overlapEstimate, c, k float64, n int, aheadOf func(s float64, i int) float64) {
		for i := range n {
			s := 0.1 + 0.1*float64(i%4)
			ahead := aheadOf(s, i)
			o.learn(s, ahead, c*(s+k*ahead))
		}
	}
	varied := func(_ float64, i int) float64 { return 0.1 * float64(i%10) }
	open := func(o *overlapEstimate) { o.overtakes, o.overtaken = minOvertakes, minOvertaken }
	cases := []struct {
		name  string
		c, k  float64
		n     int
		ahead func(float64, int) float64
		gate  bool
		want  float64
	}{
		{"a queue waits for all the work ahead", 1, 1, 20, varied, true, 1},
		{"an engine prefilling two at once waits for half", 1, 0.5, 20, varied, true, 0.5},
		{"one prefilling many waits for a fifth", 1, 0.2, 20, varied, true, 0.2},
		{"a pod 1.5× slower than its prefill model still waits for half", 1.5, 0.5, 20, varied, true, 0.5},
		{"a queue 2× slower than its model is still a queue", 2, 1, 20, varied, true, 1},
		{"no overtakes seen: taken for a queue", 1, 0.5, 20, varied, false, 1},
		{"too few iterations with work ahead (7 of 8)", 1, 0.5, 8, varied, true, 1},
		{"work ahead in proportion to the prompt: k not told apart", 1, 0.5, 20, func(s float64, _ int) float64 { return 2 * s }, true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var o overlapEstimate
			feed(&o, c.c, c.k, c.n, c.ahead)
			if c.gate {
				open(&o)
			}
			if got := o.share(); !near(got, c.want, 1e-6) {
				t.Errorf("share %.6f, want %.6f", got, c.want)
			}
		})
	}
}

// noteEnd: a prompt ending before the oldest outstanding charge is noted, and judged when that
// charge ends — more than an iteration (groupWindow) later is an overtake; an end in order
// decays the share of overtakes (EWMA, weight overlapAlpha = 0.05).
func TestOverlapEstimateNoteEnd(t *testing.T) {
	t0 := time.Unix(1000, 0)
	head := &route{picked: t0, life: &routeLife{}}
	later := &route{picked: t0.Add(secs(0.1)), life: &routeLife{}}
	for _, c := range []struct {
		name          string
		headEndsAfter time.Duration
		overtakes     int
		overtaken     float64
	}{
		{"the head ends 10 ms later: an overtake (0 + 0.05·(1 − 0))", 10 * time.Millisecond, 1, 0.05},
		{"the head ends in the same iteration: none", time.Millisecond, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var o overlapEstimate
			end := t0.Add(secs(0.5))
			o.noteEnd(end, later, head)
			if o.overtakenHead != head {
				t.Fatalf("the overtaken head was not noted")
			}
			o.noteEnd(end.Add(c.headEndsAfter), head, head)
			if o.overtakes != c.overtakes || !near(o.overtaken, c.overtaken, 1e-12) || o.overtakenHead != nil {
				t.Errorf("overtakes %d, share %.4f (head %p), want %d, %.4f, none", o.overtakes, o.overtaken, o.overtakenHead, c.overtakes, c.overtaken)
			}
		})
	}
	o := overlapEstimate{overtaken: 0.5}
	o.noteEnd(t0, head, head) // the head itself ends, in order: 0.5 − 0.05·0.5
	if !near(o.overtaken, 0.475, 1e-12) {
		t.Errorf("in order: share %.4f, want 0.475", o.overtaken)
	}
}
