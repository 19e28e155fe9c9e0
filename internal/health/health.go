package health

import (
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Reasons an endpoint is ejected, a bounded set (metric label, trace, log).
const (
	ReasonConsecutive5xx            = "consecutive_5xx"
	ReasonConsecutiveGatewayFailure = "consecutive_gateway_failure"
	ReasonRefused                   = "connection_refused"
	ReasonFailedAfterReturn         = "failed_after_return"
	// ReasonNotServingYet: the serving port refused a connection before the endpoint ever
	// answered (its engine is still starting). It lasts until the endpoint answers.
	ReasonNotServingYet = "not_serving_yet"
)

// Why a candidate was left out of a pick (trace values).
const (
	StateEjected       = "ejected"
	StateRecentFailure = "recent_failure"
)

// Reasons an ejection was refused (tandem_outlier_ejections_overflow_total's reason).
const (
	OverflowMaxPercent = "max_ejection_percent"
	OverflowLastPath   = "last_serving_path"
)

// Observer receives ejections and returns for metrics. Calls are made with the detector's lock
// held: implementations must be quick and must not call back into the detector.
type Observer interface {
	// Ejected reports an ejection and how long it lasts at least.
	Ejected(ep *pool.Endpoint, reason string, ejection time.Duration)
	// Returned reports an ejected endpoint back in rotation after it was out for `after`;
	// source names the probe that let it return ("scrape", "health_probe").
	Returned(ep *pool.Endpoint, after time.Duration, source string)
	// EjectionOverflow reports an ejection the cap refused.
	EjectionOverflow(ep *pool.Endpoint, reason, overflow string)
}

// Options configure a Detector.
type Options struct {
	Config config.Outlier
	// Store is the pool: roles, rolesets and models for the cap; endpoints to probe.
	Store *pool.Store
	// Clock (nil: the system clock).
	Clock    load.Clock
	Observer Observer
	Logger   logr.Logger
	// Recorder, when set, records the detector's own health probes, so every reader sees them
	// (the detector reads them back through Observe). Nil: the probes feed the detector directly.
	Recorder *outcome.Recorder
	// Client performs health probes (nil: a client with a 1 s timeout).
	Client *http.Client
}

// Detector is passive health: an outcome.Reader that ejects failing endpoints and tells the
// router which candidates are healthy. Safe for concurrent use; a nil *Detector ejects nothing
// and admits every candidate.
type Detector struct {
	cfg    config.Outlier
	store  *pool.Store
	clock  load.Clock
	obs    Observer
	log    logr.Logger
	rec    *outcome.Recorder
	client *http.Client

	// states is copy-on-write: the pick path reads it without a lock. Entries are added under mu.
	states atomic.Pointer[map[string]*endpoint]
	// troubled counts endpoints ejected or with a failure not yet cleared; at 0 Partition
	// returns the candidates as they are.
	troubled atomic.Int64

	mu sync.Mutex // guards every endpoint's non-atomic fields, and ejection decisions
}

// endpoint is the detector's state for one endpoint key.
type endpoint struct {
	key string
	// Read on the pick path.
	ejected atomic.Bool
	// demotedUntil is when the demotion of the last failures no success followed ends (Unix
	// ns; 0: not demoted): the recent-failure window times the consecutive failures.
	demotedUntil atomic.Int64
	reason       atomic.Pointer[string] // the ejection's reason, while ejected
	// answered: a request, leg, scrape or probe of the endpoint has succeeded since it joined.
	// Until then a refused serving port means the engine has not started yet: the endpoint is
	// held out only until it answers, with no ejection time and no ejection counted.
	answered atomic.Bool
	// answeredAt is when the last success of a scrape or probe was recorded (unix ns): a
	// refusal of a probe that started before it is older news than the success (the two ran
	// at once), and says nothing of the endpoint now.
	answeredAt atomic.Int64

	// Guarded by Detector.mu.
	troubled       bool
	cons5xx        int
	consGateway    int
	multiplier     int // ejections not yet forgiven
	ejectedAt      time.Time
	until          time.Time // the ejection time has passed from then on
	lastReturn     time.Time // when it last returned (or was first seen): forgiveness counts from here
	probation      bool      // returned and not yet succeeded: the next failure ejects at once
	probing        bool      // a health probe is in flight
	watchers       map[*watcher]struct{}
	lastOverflowed time.Time
}

type watcher struct{ f func() }

// noteAnswered records a success recorded at t (the latest wins).
func (st *endpoint) noteAnswered(t time.Time) {
	if t.IsZero() {
		return // not recorded by a recorder: no time to compare
	}
	ns := t.UnixNano()
	for {
		old := st.answeredAt.Load()
		if ns <= old || st.answeredAt.CompareAndSwap(old, ns) {
			return
		}
	}
}

func (st *endpoint) reasonNow() string {
	if r := st.reason.Load(); r != nil {
		return *r
	}
	return ""
}

// New returns a detector. It records nothing until it is subscribed to a recorder
// (outcome.Recorder.Subscribe) and probes nothing until Run.
func New(o Options) *Detector {
	if o.Clock == nil {
		o.Clock = load.SystemClock{}
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: 30 * time.Second}}
	}
	if o.Store == nil {
		o.Store = pool.NewStore()
	}
	d := &Detector{cfg: o.Config, store: o.Store, clock: o.Clock, obs: o.Observer, log: o.Logger, rec: o.Recorder, client: o.Client}
	m := map[string]*endpoint{}
	d.states.Store(&m)
	return d
}

// Enabled reports whether the detector judges endpoints at all.
func (d *Detector) Enabled() bool { return d != nil && d.cfg.Enabled }

func (d *Detector) lookup(key string) *endpoint { return (*d.states.Load())[key] }

// stateLocked returns key's state, creating it. Called with mu held.
func (d *Detector) stateLocked(key string) *endpoint {
	m := *d.states.Load()
	if st := m[key]; st != nil {
		return st
	}
	next := make(map[string]*endpoint, len(m)+1)
	for k, v := range m {
		next[k] = v
	}
	st := &endpoint{key: key, lastReturn: d.clock.Now()}
	next[key] = st
	d.states.Store(&next)
	return st
}

// retroubleLocked keeps the troubled count in step with st.
func (d *Detector) retroubleLocked(st *endpoint) {
	t := st.ejected.Load() || st.demotedUntil.Load() != 0
	if t == st.troubled {
		return
	}
	st.troubled = t
	if t {
		d.troubled.Add(1)
	} else {
		d.troubled.Add(-1)
	}
}

// Ejected reports whether the endpoint is out of rotation now.
func (d *Detector) Ejected(key string) bool {
	if !d.Enabled() {
		return false
	}
	st := d.lookup(key)
	return st != nil && st.ejected.Load()
}

// RecentFailure reports whether the endpoint is demoted for its recent failures: its last
// outcomes are k consecutive failures, the last less than k recent-failure windows ago.
func (d *Detector) RecentFailure(key string) bool {
	if !d.Enabled() || d.cfg.RecentFailure <= 0 {
		return false
	}
	st := d.lookup(key)
	return st != nil && d.recent(st, d.clock.Now())
}

func (d *Detector) recent(st *endpoint, now time.Time) bool {
	u := st.demotedUntil.Load()
	return u != 0 && now.UnixNano() < u
}

// Exclusion is a candidate a pick left out, and why (StateEjected, StateRecentFailure).
type Exclusion struct {
	Endpoint *pool.Endpoint
	State    string
	// Reason is the ejection's reason for StateEjected.
	Reason string
}

// Partition splits the candidates of a pick: healthy ones are neither ejected nor recently
// failed; usable ones are not ejected (a superset, in the same order). excluded says what was
// left out of healthy. With nothing troubled (the usual case) it returns cands twice and
// allocates nothing.
func (d *Detector) Partition(cands []*pool.Endpoint) (healthy, usable []*pool.Endpoint, excluded []Exclusion) {
	if !d.Enabled() || d.troubled.Load() == 0 {
		return cands, cands, nil
	}
	m := *d.states.Load()
	now := d.clock.Now()
	first := -1
	for i, e := range cands {
		if st := m[e.Key()]; st != nil && (st.ejected.Load() || d.recent(st, now)) {
			first = i
			break
		}
	}
	if first < 0 {
		return cands, cands, nil
	}
	healthy = append(make([]*pool.Endpoint, 0, len(cands)), cands[:first]...)
	usable = append(make([]*pool.Endpoint, 0, len(cands)), cands[:first]...)
	for _, e := range cands[first:] {
		st := m[e.Key()]
		switch {
		case st != nil && st.ejected.Load():
			excluded = append(excluded, Exclusion{Endpoint: e, State: StateEjected, Reason: st.reasonNow()})
		case st != nil && d.recent(st, now):
			usable = append(usable, e)
			excluded = append(excluded, Exclusion{Endpoint: e, State: StateRecentFailure})
		default:
			healthy = append(healthy, e)
			usable = append(usable, e)
		}
	}
	return healthy, usable, excluded
}

// OnEject calls f (once) when the endpoint is ejected, until stop is called: a prefill leg in
// flight to it is cancelled and retried elsewhere. f must be quick and must not call back into
// the detector.
func (d *Detector) OnEject(key string, f func()) (stop func()) {
	if !d.Enabled() {
		return func() {}
	}
	w := &watcher{f: f}
	d.mu.Lock()
	st := d.stateLocked(key)
	if st.ejected.Load() {
		d.mu.Unlock()
		f()
		return func() {}
	}
	if st.watchers == nil {
		st.watchers = map[*watcher]struct{}{}
	}
	st.watchers[w] = struct{}{}
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		delete(st.watchers, w)
		d.mu.Unlock()
	}
}

// Status is one endpoint's health, for logs, tests and diagnostics.
type Status struct {
	Ejected                     bool
	Reason                      string
	Until                       time.Time
	Ejections                   int // the multiplier: ejections not yet forgiven
	Consecutive5xx, ConsGateway int
	RecentFailure               bool
	Probation                   bool
}

// Status returns an endpoint's health (the zero Status for one never judged).
func (d *Detector) Status(key string) Status {
	if d == nil {
		return Status{}
	}
	st := d.lookup(key)
	if st == nil {
		return Status{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return Status{Ejected: st.ejected.Load(), Reason: st.reasonNow(), Until: st.until, Ejections: st.multiplier,
		Consecutive5xx: st.cons5xx, ConsGateway: st.consGateway, RecentFailure: d.recent(st, d.clock.Now()),
		Probation: st.probation}
}

// EjectedKeys lists the endpoints ejected now.
func (d *Detector) EjectedKeys() []string {
	if !d.Enabled() {
		return nil
	}
	var out []string
	for k, st := range *d.states.Load() {
		if st.ejected.Load() {
			out = append(out, k)
		}
	}
	return out
}

// ejectionTime is base × multiplier, at most the maximum; a maximum below base takes base, as
// Envoy's max_ejection_time does.
func (d *Detector) ejectionTime(multiplier int) time.Duration {
	base, limit := d.cfg.BaseEjectionTime, max(d.cfg.MaxEjectionTime, d.cfg.BaseEjectionTime)
	if multiplier < 1 {
		multiplier = 1
	}
	if limit > 0 && base > 0 && int64(multiplier) > int64(limit/base) {
		return limit
	}
	return time.Duration(multiplier) * base
}

// forgivenLocked decrements the multiplier once per interval the endpoint stayed in rotation
// since it last returned (Envoy decrements it at every interval sweep of a healthy host).
func (d *Detector) forgivenLocked(st *endpoint, now time.Time) {
	if st.multiplier == 0 || d.cfg.Interval <= 0 {
		return
	}
	n := int(now.Sub(st.lastReturn) / d.cfg.Interval)
	st.multiplier = max(0, st.multiplier-n)
}

// maxEjected is how many endpoints of a group of n may be ejected at once: pct of n rounded
// down, but at least one (Envoy ejects at least one host whatever the percentage).
func maxEjected(n int, pct float64) int {
	return max(1, int(math.Floor(float64(n)*pct/100+1e-9)))
}
