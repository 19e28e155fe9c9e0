package latency

import "time"

// The iteration end groups: prefills that ended together on a pod, and how their shared
// busy time is split among them to fit the pod's prefill model and its overlap estimate.

// endGroup is prefills that ended within groupWindow of each other: an engine batches
// short prompts into one iteration, so their ends coincide and the time the pod spent on
// them is shared. The group's busy time (from the later of its first pick and the pod's
// previous end, to its last end) is split among them in proportion to their predicted
// service, which a FIFO estimate per prefill cannot do (it would give the first the
// whole iteration and the others nothing).
type endGroup struct {
	start, last time.Time
	items       []groupItem
	predicted   float64
	// The group's earliest pick and the work booked ahead of that prompt then, the hand-over
	// the last end's time includes, and whether every end in it tells the overlap (none ran
	// behind work others routed): one observation of the overlap, as one iteration's worth of
	// prompts served behind the same work.
	firstPick           time.Time
	firstAhead, lastAdj float64
	overlapUnknown      bool
}

type groupItem struct {
	prompt          Prompt
	service, adjust float64
	fit             fitKind
}

// fitKind says how an ended prefill informs the pod's prefill model.
type fitKind uint8

const (
	fitObserved fitKind = iota // its end was observed where it ran
	fitInferred                // inferred from the decode pod's answer
	fitNone                    // work Tandem did not route may have run first: its start is unknown
)

// groupWindow: ends closer than this belong to one iteration.
const groupWindow = 2 * time.Millisecond

// prefillEnded books the end of r's prefill at t on the pod: the ledger is corrected now;
// the service fit waits until t's group is complete. adjust: seconds of hand-over the
// observed time includes (an end inferred from the decode pod's answer).
func (q *pod) prefillEnded(t time.Time, r *route, fit fitKind, adjust float64) {
	if len(q.group.items) > 0 && t.Sub(q.group.last) > groupWindow {
		q.flushGroup()
	}
	// The prompt started when the prompts ahead of it ended, on an engine that serves one at a
	// time; at its pick on one that overlaps them (and in between as far as it does).
	start := laterOf(r.picked, q.ledger.lastEnd)
	if k := q.overlap(); k < 1 && q.ledger.lastEnd.After(r.picked) {
		start = r.picked.Add(seconds(k * q.ledger.lastEnd.Sub(r.picked).Seconds()))
	}
	if fit == fitObserved && !r.unseenHist {
		// Only an end observed where the prompt ran tells the engine's order (an inferred end
		// holds the hand-over too).
		q.overlapEst.noteEnd(t, r, q.ledger.headCharge())
	}
	if q.group.add(t, start, r, fit, adjust) != fitNone {
		q.ends.observed++
	}
	q.ends.add(r.prompt)
	q.queue.ownQueued++
	q.ledger.finish(t, r.due, r.shiftAt)
	q.ledger.lastService = r.service
	q.addWork(t, r.service)
}

// add puts r's prefill, started at start (as far as the pod can tell) and ended at t, in the
// group, and returns how it informs the prefill model (fitNone when work others routed ran
// there too).
func (g *endGroup) add(t, start time.Time, r *route, fit fitKind, adjust float64) fitKind {
	if len(g.items) == 0 {
		g.start, g.firstPick, g.firstAhead, g.overlapUnknown = start, r.picked, r.ahead, false
	} else if start.Before(g.start) {
		g.start = start
	}
	if r.picked.Before(g.firstPick) {
		g.firstPick, g.firstAhead = r.picked, r.ahead
	}
	g.last, g.lastAdj = t, adjust
	g.overlapUnknown = g.overlapUnknown || fit != fitObserved || r.unseenHist
	if r.unseenHist {
		// Work others routed ran here too: the prompt's start is not known, and the time to
		// its end would teach the prefill model their work.
		fit = fitNone
	}
	g.items = append(g.items, groupItem{prompt: r.prompt, service: r.service, adjust: adjust, fit: fit})
	g.predicted += r.service
	return fit
}

// flushGroup fits the prefill model on the ended group's share of the busy time.
func (q *pod) flushGroup() {
	g := &q.group
	busy := g.last.Sub(g.start).Seconds()
	if busy > 0 && g.predicted > 0 {
		for _, it := range g.items {
			obs := busy*it.service/g.predicted - it.adjust
			switch it.fit {
			case fitObserved:
				q.fitPrefill(it.prompt, obs)
			case fitInferred:
				q.fitInferred(it.prompt, obs)
			}
		}
	}
	if !g.overlapUnknown {
		q.overlapEst.learn(g.predicted, g.firstAhead, g.last.Sub(g.firstPick).Seconds()-g.lastAdj)
	}
	g.items, g.predicted = g.items[:0], 0
}
