package latency

import "time"

// overlapEstimate is how much of the booked work ahead a prompt routed to one pod actually
// waits for: 1 on an engine that prefills one prompt at a time, less on one that prefills
// many at once. It owns the regression over iterations' prefill ends and the overtake gate
// (ends out of booking order); the ledger it corrects is the pod's.
//
// Each iteration's observed prefill ends (endGroup), timed from its first pick, are regressed
// on their predicted prefill (s) and the work booked ahead of that prompt at its pick (x),
// weighted relative to their sum; ss…xt are the decayed sums of the normal equations (t the
// observed time), n the iterations with work ahead among them. The overlap is x's coefficient
// over s's, so an error of the prefill model, which scales both alike, does not pass for one.
type overlapEstimate struct {
	ss, sx, xx, st, xt float64
	n                  int
	// overtaken: the share of recent prefill ends that came before the end of a prompt booked
	// earlier on the pod (EWMA): a queue never lets a later prompt finish first, so without
	// it the pod is not taken for one that overlaps prompts, whatever the regression says.
	// overtakenHead is the oldest outstanding charge when a later one ended first, at
	// overtakenAt (it overtook if the head ends more than an iteration later).
	overtaken     float64
	overtakes     int // overtakes seen (the gate opens after minOvertakes)
	overtakenHead *route
	overtakenAt   time.Time
}

// The overlap constants: the decay of a prompt's weight in the regression; the prompts with
// booked work ahead of at least minOverlapAhead seconds seen before the estimate is used.
const (
	overlapAlpha    = 0.05
	minOverlapN     = 8
	minOverlapAhead = 0.002
	// minOvertaken, minOvertakes: the share of recent ends out of booking order, and how many
	// such ends seen, from which a pod may overlap prompts (one stray end does not open it)
	minOvertaken = 0.05
	minOvertakes = 3
)

// noteEnd notes whether r's prefill, ending at t, ended in booking order: it ended before the
// oldest charge still outstanding, head (a later prompt first: noted, and judged when that one
// ends, ends within one iteration being one), or it is that charge (its end judges the
// overtake).
func (o *overlapEstimate) noteEnd(t time.Time, r, head *route) {
	if h := o.overtakenHead; h != nil && h != r && (h.prefillDone || h.life.gone) {
		o.overtakenHead = nil // it never ended here (failed, cancelled, forgotten): nothing to judge
	}
	switch h := head; {
	case r == o.overtakenHead:
		late := 0.0
		if t.Sub(o.overtakenAt) > groupWindow {
			late = 1
			o.overtakes++
		}
		o.overtaken += overlapAlpha * (late - o.overtaken)
		o.overtakenHead = nil
	case h != nil && h.picked.Before(r.picked):
		if o.overtakenHead == nil {
			o.overtakenHead, o.overtakenAt = h, t
		}
	default:
		o.overtaken -= overlapAlpha * o.overtaken
	}
}

// share is the share of the booked work ahead that a prompt routed here is expected to wait
// for, in [0, 1]: 1 until the pod showed otherwise (a queue serving one prompt at a time), less
// on an engine that prefills prompts concurrently, so that work booked ahead delays a new one
// less than its whole length.
func (o *overlapEstimate) share() float64 {
	if o.n < minOverlapN || o.overtakes < minOvertakes || o.overtaken < minOvertaken {
		return 1
	}
	det := o.ss*o.xx - o.sx*o.sx
	if !(det > 1e-6*o.ss*o.xx) { // the work ahead did not vary apart from the prompts
		return 1
	}
	a := (o.st*o.xx - o.xt*o.sx) / det
	b := (o.xt*o.ss - o.st*o.sx) / det
	if !(a > 0) {
		return 1
	}
	return min(max(b/a, 0), 1)
}

// learn folds in prompts of predicted prefill s (an engine iteration's worth, which ended
// together) of which the first picked had ahead seconds of booked work before it at its pick
// and the last ended observed seconds after that pick.
func (o *overlapEstimate) learn(s, ahead, observed float64) {
	if !(s > 0) || !(observed > 0) || ahead < 0 {
		return
	}
	w := 1 / ((s + ahead) * (s + ahead))
	d := 1 - overlapAlpha
	o.ss = d*o.ss + w*s*s
	o.sx = d*o.sx + w*s*ahead
	o.xx = d*o.xx + w*ahead*ahead
	o.st = d*o.st + w*s*observed
	o.xt = d*o.xt + w*ahead*observed
	if ahead >= minOverlapAhead {
		o.n++
	}
}
