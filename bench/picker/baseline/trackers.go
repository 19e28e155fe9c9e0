package baseline

import (
	"sync"

	"github.com/tandem-epp/tandem/internal/load"
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
// release is idempotent.
type lifecycle struct {
	deps       *picker.Deps
	key        string // the destination endpoint's key; the served one once known
	prefillKey string // the prefill endpoint's key; "" for a combined pod
	dest       []*pool.Endpoint

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

func newPairLifecycle(c *Cascade, prefill, decode *pool.Endpoint) *lifecycle {
	return &lifecycle{deps: c.deps, key: decode.Key(), prefillKey: prefill.Key(),
		releasePrefill: c.prefill.Start(prefill.Key()),
		releasePending: c.pending.Start(decode.Key())}
}

func newCombinedLifecycle(c *Cascade, ranked []*pool.Endpoint) *lifecycle {
	return &lifecycle{deps: c.deps, key: ranked[0].Key(), dest: ranked, releaseRunning: c.deps.Running.Start(ranked[0].Key())}
}

// PrefillDone ends the prefill leg (EPP hand-off calls it when the prefill call returns).
// A failed prefill also releases the policy ledgers' request charges at once (the seed
// releases kv and decode tokens when the prefill call fails); the trackers wait for Done.
func (l *lifecycle) PrefillDone(err error) {
	l.mu.Lock()
	l.prefillDoneLocked()
	var done []func()
	if err != nil {
		done, l.chargeDone = l.chargeDone, nil
	}
	l.mu.Unlock()
	for _, f := range done {
		f()
	}
}

func (l *lifecycle) prefillDoneLocked() {
	if l.releasePrefill != nil {
		l.releasePrefill()
		l.releasePrefill = nil
		if l.deps.Drain != nil {
			l.deps.Drain.Record(l.prefillKey)
		}
	}
	for _, f := range l.chargePrefill {
		f()
	}
	l.chargePrefill = nil
}

// ResponseHeaders implements picker.Lifecycle: the decode pod is answering. When the
// gateway reports that a fallback served the request, that endpoint is the one counted.
func (l *lifecycle) ResponseHeaders(_ int, served *pool.Endpoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return
	}
	was := l.key
	if served != nil {
		l.key = served.Key()
	}
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

// ResponseBody implements picker.Lifecycle.
func (l *lifecycle) ResponseBody(int, bool) {}

// Done implements picker.Lifecycle.
func (l *lifecycle) Done(error) {
	l.mu.Lock()
	if l.finished {
		l.mu.Unlock()
		return
	}
	l.finished = true
	l.prefillDoneLocked()
	for _, rel := range []*func(){&l.releasePending, &l.releaseRunning} {
		if *rel != nil {
			(*rel)()
			*rel = nil
		}
	}
	done := l.chargeDone
	l.chargeDone = nil
	l.mu.Unlock()
	if l.deps.Drain != nil {
		l.deps.Drain.Record(l.key)
	}
	for _, f := range done {
		f()
	}
}

// PrefillObserver is implemented by the Lifecycle of PD decisions: a hand-off that runs
// the prefill leg itself calls PrefillDone when that call returns.
type PrefillObserver interface {
	PrefillDone(err error)
}

var (
	_ picker.Lifecycle = (*lifecycle)(nil)
	_ PrefillObserver  = (*lifecycle)(nil)
)

// forgetGone drops tracker entries of endpoints no longer in the snapshot.
func forgetGone(snap *pool.Snapshot, trackers []*load.Tracker, rates []*load.Rate) {
	if snap == nil {
		return
	}
	live := make(map[string]struct{}, len(snap.Endpoints))
	for _, e := range snap.Endpoints {
		live[e.Key()] = struct{}{}
	}
	for _, t := range trackers {
		for _, k := range t.Keys() {
			if _, ok := live[k]; !ok {
				t.Forget(k)
			}
		}
	}
	for _, r := range rates {
		for _, k := range r.Keys() {
			if _, ok := live[k]; !ok {
				r.Forget(k)
			}
		}
	}
}
