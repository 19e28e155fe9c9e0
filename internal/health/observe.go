package health

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// How one outcome counts against an endpoint: the counters it increments (Envoy maps a locally
// originated error to a 5xx as well, when it does not split them).
type verdict struct {
	fiveXX, gateway bool
	what            string // for the log
}

// statusVerdict judges an answer's status: 5xx counts, 502/503/504 are gateway failures too;
// anything else (2xx-4xx) is a success.
func statusVerdict(status int) (verdict, bool) {
	if status < 500 {
		return verdict{}, false
	}
	return verdict{fiveXX: true, gateway: status == 502 || status == 503 || status == 504, what: "status"}, true
}

// gatewayVerdict is a failure to reach the endpoint.
var gatewayVerdict = verdict{fiveXX: true, gateway: true, what: "unreachable"}

// Observe implements outcome.Reader.
func (d *Detector) Observe(e *outcome.Event) {
	if !d.Enabled() {
		return
	}
	switch e.Phase {
	case outcome.PhaseEnd:
		d.observeEnd(&e.Route)
	case outcome.PhasePrefillEnd:
		if e.Route.PrefillObserved && e.Route.Prefill != "" {
			d.judgeLeg(e.Route.Prefill, e.Route.PrefillErr)
		}
	case outcome.PhaseProbe:
		if e.Probe != nil {
			d.observeProbe(e.Probe)
		}
	}
}

// observeEnd judges a route's destination (and the fallbacks the gateway skipped).
func (d *Detector) observeEnd(r *outcome.Route) {
	f := outcome.FailureOf(r.Err)
	if f != nil && f.Origin == outcome.OriginCaller {
		return // the client left: nothing is known of the endpoint
	}
	if r.Paired() && r.PrefillErr != nil && r.Headers.IsZero() {
		return // the prefill leg failed (judged on the prefill pod): the decode leg never ran
	}
	if r.Served != "" && r.Served != r.Destination {
		// The gateway reached a fallback: it could not connect to those before it.
		skipped := append([]string{r.Destination}, r.Fallbacks...)
		for _, k := range skipped {
			if k == r.Served {
				break
			}
			d.fail(k, gatewayVerdict)
		}
	}
	target := r.ServedBy()
	switch {
	case f != nil && f.Origin == outcome.OriginGateway:
		d.fail(target, gatewayVerdict)
	case f != nil && f.Origin == outcome.OriginUpstream:
		if v, bad := statusVerdict(f.Status); bad {
			d.fail(target, v)
		}
	case r.Status >= 500:
		v, _ := statusVerdict(r.Status)
		d.fail(target, v)
	case r.Status > 0 && r.Err == nil:
		d.succeed(target)
	}
	// Otherwise (a response cut after its headers, an unobserved end, Tandem's own error) the
	// route says nothing about the endpoint.
}

// judgeLeg judges a prefill leg's result on the prefill endpoint.
func (d *Detector) judgeLeg(key string, err error) {
	if err == nil {
		d.succeed(key)
		return
	}
	f := outcome.FailureOf(err)
	switch {
	case f == nil:
		if errors.Is(err, context.Canceled) {
			return
		}
		d.fail(key, gatewayVerdict) // no answer at all
	case f.Origin == outcome.OriginGateway:
		d.fail(key, gatewayVerdict)
	case f.Origin == outcome.OriginUpstream:
		if v, bad := statusVerdict(f.Status); bad {
			d.fail(key, v)
		}
		// a 4xx is the request's fault, not the pod's
	}
}

func (d *Detector) observeProbe(p *outcome.Probe) {
	switch {
	case p.Err == nil:
		d.probeSucceeded(p.Endpoint, p.Source, p.At)
	case p.Refused && p.ServingPort:
		d.mu.Lock()
		st := d.stateLocked(p.Endpoint)
		if !p.At.IsZero() && p.At.Add(-p.Took).UnixNano() < st.answeredAt.Load() {
			// A scrape or probe that succeeded was recorded after this one started: the
			// refusal is older than the success, not evidence against a pod that serves.
			d.mu.Unlock()
			return
		}
		d.markFailedLocked(st)
		notify := d.ejectLocked(st, ReasonRefused)
		d.retroubleLocked(st)
		d.mu.Unlock()
		notifyAll(notify)
	case p.Timeout:
		d.fail(p.Endpoint, verdict{gateway: true, what: "probe_timeout"})
	}
}

// markFailedLocked demotes st after a failure: for the recent-failure window times its
// consecutive failures (a pod failing again and again is tried ever less often), at most the
// longest ejection.
func (d *Detector) markFailedLocked(st *endpoint) {
	if d.cfg.RecentFailure <= 0 {
		return
	}
	k := max(1, st.cons5xx, st.consGateway)
	dur := time.Duration(k) * d.cfg.RecentFailure
	if limit := d.cfg.MaxEjectionTime; limit > 0 && dur > limit {
		dur = limit
	}
	st.demotedUntil.Store(d.clock.Now().Add(dur).UnixNano())
}

// fail counts a failure against key and ejects it when a threshold is crossed.
func (d *Detector) fail(key string, v verdict) {
	if key == "" {
		return
	}
	d.mu.Lock()
	st := d.stateLocked(key)
	if st.ejected.Load() {
		// A request that was in flight when the endpoint was ejected: nothing more to learn.
		d.mu.Unlock()
		return
	}
	if v.fiveXX {
		st.cons5xx++
	}
	if v.gateway {
		st.consGateway++
	} else {
		st.consGateway = 0 // Envoy: a non-gateway 5xx ends a run of gateway failures
	}
	d.markFailedLocked(st)
	var notify []func()
	switch {
	case st.probation:
		notify = d.ejectLocked(st, ReasonFailedAfterReturn)
	case d.cfg.Consecutive5xx > 0 && st.cons5xx >= d.cfg.Consecutive5xx:
		notify = d.ejectLocked(st, ReasonConsecutive5xx)
	case d.cfg.ConsecutiveGatewayFailure > 0 && st.consGateway >= d.cfg.ConsecutiveGatewayFailure:
		notify = d.ejectLocked(st, ReasonConsecutiveGatewayFailure)
	}
	d.retroubleLocked(st)
	d.mu.Unlock()
	notifyAll(notify)
}

// succeed clears key's failure counts and records that it answers.
func (d *Detector) succeed(key string) {
	st := d.lookup(key)
	if st == nil {
		d.answered(key, time.Time{}) // its first answer: nothing to clear
		return
	}
	if st.demotedUntil.Load() == 0 && !st.ejected.Load() {
		d.mu.Lock()
		clean := st.cons5xx == 0 && st.consGateway == 0 && !st.probation && st.answered.Load()
		d.mu.Unlock()
		if clean {
			return
		}
	}
	d.mu.Lock()
	st.cons5xx, st.consGateway, st.probation = 0, 0, false
	st.answered.Store(true)
	st.demotedUntil.Store(0)
	d.retroubleLocked(st)
	d.mu.Unlock()
}

// ejectLocked ejects st unless the cap forbids it, and returns the watchers to notify once the
// lock is released.
func (d *Detector) ejectLocked(st *endpoint, reason string) []func() {
	if st.ejected.Load() {
		return nil
	}
	now := d.clock.Now()
	snap := d.store.Load()
	ep := findEndpoint(snap, st.key)
	if ep == nil {
		return nil // not in the pool (any more): nothing to route around
	}
	// Nothing listens yet (the engine is starting, or Tandem started first, and requests found
	// no listener before the first scrape did): out of rotation until a scrape or probe
	// answers, which is no ejection to count.
	unreachable := reason == ReasonRefused || st.consGateway > 0 && st.consGateway == st.cons5xx
	starting := unreachable && !st.answered.Load()
	if starting {
		reason = ReasonNotServingYet
	}
	if overflow := d.capRefusesLocked(snap, ep, starting); overflow != "" {
		if d.obs != nil {
			d.obs.EjectionOverflow(ep, reason, overflow)
		}
		if now.Sub(st.lastOverflowed) > d.cfg.Interval {
			st.lastOverflowed = now
			d.log.Info("outlier detection: not ejecting a failing endpoint, to keep the pool serving", "endpoint", st.key,
				"reason", reason, "refused", overflow)
		}
		return nil
	}
	var dur time.Duration
	if !starting {
		d.forgivenLocked(st, now)
		st.multiplier++
		dur = d.ejectionTime(st.multiplier)
	}
	st.ejectedAt, st.until = now, now.Add(dur)
	st.cons5xx, st.consGateway, st.probation = 0, 0, false
	r := reason
	st.reason.Store(&r)
	st.ejected.Store(true)
	if d.obs != nil {
		d.obs.Ejected(ep, reason, dur)
	}
	if reason == ReasonNotServingYet {
		d.log.Info("outlier detection: endpoint not serving yet (its port refuses connections); out of rotation until it answers",
			"endpoint", st.key)
	} else {
		d.log.Info("outlier detection: endpoint ejected", "endpoint", st.key, "reason", reason, "ejection", dur.String(),
			"ejections", st.multiplier)
	}
	var notify []func()
	for w := range st.watchers {
		notify = append(notify, w.f)
	}
	st.watchers = nil
	return notify
}

func notifyAll(fs []func()) {
	for _, f := range fs {
		f()
	}
}

// probeSucceeded records that key answers, and returns it if it is ejected and its ejection
// time has passed.
func (d *Detector) probeSucceeded(key, source string, at time.Time) {
	st := d.lookup(key)
	if st != nil {
		st.noteAnswered(at)
	}
	if st != nil && st.answered.Load() && !st.ejected.Load() {
		return // the common case: a scrape of an endpoint known to serve
	}
	if st == nil {
		d.answered(key, at)
		return
	}
	now := d.clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	st.answered.Store(true)
	if !st.ejected.Load() || now.Before(st.until) {
		return
	}
	out := now.Sub(st.ejectedAt)
	starting := st.reasonNow() == ReasonNotServingYet
	st.ejected.Store(false)
	st.reason.Store(nil)
	st.demotedUntil.Store(0)
	st.cons5xx, st.consGateway = 0, 0
	// A returned endpoint is on probation (its next failure ejects it at once); one that only
	// started late is judged like any other.
	st.probation, st.lastReturn = !starting, now
	d.retroubleLocked(st)
	if starting {
		// No ejection was counted, so no return is: the engine has started.
		d.log.Info("outlier detection: endpoint serving", "endpoint", key, "after", out.String(), "probe", source)
		return
	}
	if ep := findEndpoint(d.store.Load(), key); ep != nil {
		if d.obs != nil {
			d.obs.Returned(ep, out, source)
		}
	}
	d.log.Info("outlier detection: endpoint returned", "endpoint", key, "after", out.String(), "probe", source)
}

// answered records the first answer of an endpoint the detector keeps no state for yet (once
// per endpoint: the state it creates is found by every later answer), recorded at at (zero:
// a request's answer, which has no probe time to compare).
func (d *Detector) answered(key string, at time.Time) {
	if key == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if findEndpoint(d.store.Load(), key) == nil {
		return // not (or no longer) in the pool: keep no state for it
	}
	st := d.stateLocked(key)
	st.noteAnswered(at) // before answered: a refusal that sees it answered sees when
	st.answered.Store(true)
}

// capRefusesLocked says why ejecting ep would break the cap ("" when it would not): more than
// max_ejection_percent of ep's model and role group ejected, or no way left to serve the model
// (no complete roleset and no standard pod in rotation). The percentage is of the serving
// capacity: a pod held out because it never served (not_serving_yet) is neither counted in its
// group nor as one of its ejected, and holding one out (starting) is refused only when it
// would leave no way to serve.
func (d *Detector) capRefusesLocked(snap *pool.Snapshot, ep *pool.Endpoint, starting bool) string {
	m := *d.states.Load()
	isEjected := func(e *pool.Endpoint) bool {
		if e == ep {
			return true
		}
		st := m[e.Key()]
		return st != nil && st.ejected.Load()
	}
	neverServed := func(e *pool.Endpoint) bool {
		st := m[e.Key()]
		return e != ep && st != nil && st.ejected.Load() && st.reasonNow() == ReasonNotServingYet
	}
	group := roleGroup(ep.Role)
	n, k := 0, 0
	standard := false
	for _, e := range snap.Endpoints {
		if e.Model != ep.Model {
			continue
		}
		if roleGroup(e.Role) == group && !neverServed(e) {
			n++
			if e != ep && isEjected(e) {
				k++
			}
		}
		if e.Role == pool.RoleStandard && !isEjected(e) {
			standard = true
		}
	}
	if !starting && k+1 > maxEjected(n, d.cfg.MaxEjectionPercent) {
		return OverflowMaxPercent
	}
	if standard {
		return ""
	}
	// The last complete pair is counted per revision: a prefill pod of one revision and a
	// decode pod of another are no pair. Pods without a roleset-name (llm-d's labelling) form
	// the roleset "" of their revision, and pair as such.
	inRotation := func(e *pool.Endpoint) bool { return !isEjected(e) }
	for _, g := range snap.Rolesets() {
		if g.Model == ep.Model &&
			slices.ContainsFunc(g.Prefill, inRotation) && slices.ContainsFunc(g.Decode, inRotation) {
			return ""
		}
	}
	return OverflowLastPath
}

// roleGroup is the cap's group of a role: prefill pods, or the pods that serve requests
// (decode and standard: a request's destination is one of them).
func roleGroup(r pool.Role) string {
	if r == pool.RolePrefill {
		return "prefill"
	}
	return "serving"
}

func findEndpoint(snap *pool.Snapshot, key string) *pool.Endpoint {
	ep, _ := snap.ByKey(key)
	return ep
}

var _ outcome.Reader = (*Detector)(nil)
