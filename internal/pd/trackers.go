package pd

import (
	"sync"

	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// lifecycle follows one PD (or combined) request after the pick and releases what the pick
// registered. For a pair: the prefill request counts as in flight on the prefill pod and
// the request as a pending decode on the decode pod until the decode pod starts answering
// (response headers: in sidecar hand-off the prefill leg is over by then) or the hand-off
// reports PrefillDone; from then on it counts as running on the decode pod until Done,
// which also feeds the decode pod's drain rate. The end of the prefill leg (however it
// ends) feeds the prefill pod's drain rate, which step 0b divides its backlog by. Every
// release is idempotent. Every event also goes to the route's outcome record in
// Deps.Outcomes, the decision's Route.
type lifecycle struct {
	deps       *picker.Deps
	key        string // the destination endpoint's key; the served one once known
	prefillKey string // the prefill endpoint's key; "" for a combined pod
	dest       []*pool.Endpoint
	route      *outcome.Tracker // nil without a recorder
	// The drain series of the prefill pod and of the destination (the served one once known),
	// taken with their counts: a completion counts on the pod the request ran on.
	drainPrefill, drainDest *load.Series

	mu             sync.Mutex
	releasePrefill func()
	releasePending func()
	releaseRunning func()
	finished       bool
	// Policy ledgers (Charger): released with the prefill leg, and at Done.
	chargePrefill []func()
	chargeDone    []func()
}

// charge records a Charger's releases.
func (l *lifecycle) charge(prefillDone, requestDone func()) {
	if prefillDone != nil {
		l.chargePrefill = append(l.chargePrefill, prefillDone)
	}
	if requestDone != nil {
		l.chargeDone = append(l.chargeDone, requestDone)
	}
}

func newPairLifecycle(c *Cascade, prefill, decode *pool.Endpoint, promptTokens int) *lifecycle {
	return &lifecycle{deps: c.deps, key: decode.Key(), prefillKey: prefill.Key(),
		drainPrefill: c.deps.Drain.Series(prefill.Key()), drainDest: c.deps.Drain.Series(decode.Key()),
		releasePrefill: c.prefill.Start(prefill.Key()),
		releasePending: c.pending.Start(decode.Key()),
		route:          c.deps.Outcomes.Start(outcome.KindPD, prefill.Key(), decode.Key(), promptTokens)}
}

// newWholeLifecycle follows a request that runs whole on ranked[0] (a combined pod, or a
// decode pod running the prompt itself): counted as running there from the pick.
func newWholeLifecycle(c *Cascade, ranked []*pool.Endpoint, promptTokens int) *lifecycle {
	return &lifecycle{deps: c.deps, key: ranked[0].Key(), dest: ranked, releaseRunning: c.deps.Running.Start(ranked[0].Key()),
		drainDest: c.deps.Drain.Series(ranked[0].Key()),
		route:     c.deps.Outcomes.Start(outcome.KindWhole, "", ranked[0].Key(), promptTokens)}
}

// adopt makes l the decision's lifecycle and its outcome record the decision's route.
func (l *lifecycle) adopt(d *picker.Decision) { d.Lifecycle, d.Route = l, l.route }

// RouteID is the route's outcome ID (0 without a recorder): what a pick's charge on the
// latency models is keyed by.
func (l *lifecycle) RouteID() uint64 { return l.route.ID() }

// PrefillDone ends the prefill leg (EPP hand-off calls it when the prefill call returns).
// A failed prefill also releases the policy ledgers' request charges at once (the seed
// releases kv and decode tokens when the prefill call fails); the trackers wait for Done.
func (l *lifecycle) PrefillDone(err error) {
	l.route.PrefillEnd(err, true)
	for _, f := range l.endPrefill(err != nil) {
		f()
	}
}

// endPrefill ends the prefill leg under the lock (released even if a release panics) and,
// when the leg failed, takes the request charges for the caller to release.
func (l *lifecycle) endPrefill(failed bool) (done []func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prefillDoneLocked()
	if failed {
		done, l.chargeDone = l.chargeDone, nil
	}
	return done
}

func (l *lifecycle) prefillDoneLocked() {
	if l.releasePrefill != nil {
		l.releasePrefill()
		l.releasePrefill = nil
		l.deps.Drain.RecordTo(l.drainPrefill)
	}
	for _, f := range l.chargePrefill {
		f()
	}
	l.chargePrefill = nil
}

// RoutedWhole implements WholeRouter: the pair runs whole on its decode pod, so no prefill
// leg runs. The prefill pod's in-flight count and the ledgers' prefill charges end now,
// without a completion on its drain rate, and the outcome record says the leg never ran:
// the latency models give its booking back rather than time a prefill that took no time.
func (l *lifecycle) RoutedWhole() {
	l.route.PrefillEnd(outcome.ErrPrefillNotRun, false)
	for _, f := range l.skipPrefill() {
		f()
	}
}

// skipPrefill ends the prefill pod's in-flight count under the lock (released even if the
// release panics) and takes the prefill charges for the caller to release.
func (l *lifecycle) skipPrefill() []func() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.releasePrefill != nil {
		l.releasePrefill()
		l.releasePrefill = nil
	}
	charges := l.chargePrefill
	l.chargePrefill = nil
	return charges
}

// ResponseHeaders implements picker.Lifecycle: the decode pod is answering. When the
// gateway reports that a fallback served the request, that endpoint is the one counted.
func (l *lifecycle) ResponseHeaders(status int, served *pool.Endpoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return
	}
	was, whole := l.key, false
	if e := served; e != nil {
		// A combined fallback that served ran the whole request: no sidecar took the leg there.
		l.key, whole = e.Key(), e.Role != pool.RoleDecode
		if l.key != was {
			l.drainDest = l.deps.Drain.Series(l.key)
		}
	}
	// The leg's end as the answer shows it (an EPP hand-off that reported it already counts
	// first).
	l.route.Answered(status, l.key, whole)
	l.prefillDoneLocked()
	switch {
	case l.releasePending != nil:
		l.releasePending()
		l.releasePending = nil
		l.releaseRunning = l.deps.Running.Start(l.key)
	case l.releaseRunning != nil && l.key != was:
		// A combined pod counted from the pick: a fallback served, so the count moves.
		l.releaseRunning()
		l.releaseRunning = l.deps.Running.Start(l.key)
	}
}

// ResponseBody implements picker.Lifecycle: chunk times go to the outcome record.
func (l *lifecycle) ResponseBody(size int, _ bool) { l.route.Chunk(size) }

// Done implements picker.Lifecycle.
func (l *lifecycle) Done(err error) {
	l.route.End(err)
	done, drain, first := l.finish()
	if !first {
		return
	}
	l.deps.Drain.RecordTo(drain)
	for _, f := range done {
		f()
	}
}

// finish releases the request's counts under the lock (released even if a release panics)
// and takes its request charges and the destination's drain series; first is false when the
// request had already finished.
func (l *lifecycle) finish() (done []func(), drain *load.Series, first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return nil, nil, false
	}
	l.finished = true
	l.prefillDoneLocked()
	for _, rel := range []*func(){&l.releasePending, &l.releaseRunning} {
		if *rel != nil {
			(*rel)()
			*rel = nil
		}
	}
	done, l.chargeDone = l.chargeDone, nil
	return done, l.drainDest, true
}

// PrefillObserver is implemented by the Lifecycle of PD decisions: a hand-off that runs
// the prefill leg itself calls PrefillDone when that call returns.
type PrefillObserver interface {
	PrefillDone(err error)
}

// WholeRouter is implemented by the Lifecycle of PD decisions: a server that sends a pair
// whole to its decode pod (its client cannot carry the hand-off) calls RoutedWhole instead of
// PrefillDone.
type WholeRouter interface {
	RoutedWhole()
}

// RoutedWhole tells lc, a PD decision's lifecycle (perhaps wrapped), that its pair runs whole
// on the decode pod: WholeRouter's RoutedWhole, else the end of a prefill leg
// (PrefillObserver) so that what the pick charged to the prefill pod is released.
func RoutedWhole(lc picker.Lifecycle) {
	switch l := lc.(type) {
	case WholeRouter:
		l.RoutedWhole()
	case PrefillObserver:
		l.PrefillDone(nil)
	}
}

var (
	_ picker.Lifecycle = (*lifecycle)(nil)
	_ PrefillObserver  = (*lifecycle)(nil)
	_ WholeRouter      = (*lifecycle)(nil)
)
