package bucketserve

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
)

// Plan cache limits: a plan is recomputed at most every PlanTTL; a model keeps at most
// MaxPlansPerModel plans (one per mode and set of rolesets), the oldest evicted first.
const (
	PlanTTL          = 5 * time.Second
	MaxPlansPerModel = 8
	// ModelIdleAfter: a model not routed for this long (20 half-lives: its traffic has
	// decayed to about 1e-6) is forgotten with its plans. Model names come from request
	// bodies, so without this the planner would keep every name it was ever sent.
	ModelIdleAfter = 10 * time.Minute
)

// Metrics receives the planner's per-roleset series (*telemetry.Metrics implements it):
// pd_bucket_serve_band_total and _prompt_tokens_total when a band routes a request, the
// pd_bucket_serve_band_max gauge per roleset in a plan, deleted when a plan drops it.
type Metrics interface {
	BucketServeBand(roleset string, promptTokens int)
	SetBucketServeBandMax(roleset string, max int)
	DropBucketServeRoleset(roleset string)
}

type nopMetrics struct{}

func (nopMetrics) BucketServeBand(string, int)       {}
func (nopMetrics) SetBucketServeBandMax(string, int) {}
func (nopMetrics) DropBucketServeRoleset(string)     {}

// Planner keeps the per-model histograms and plans. Safe for concurrent use.
type Planner struct {
	clock   load.Clock
	metrics Metrics

	mu     sync.Mutex
	models map[string]*model
	// rolesets counts the cached plans naming each roleset, so its gauge is deleted only
	// when no plan names it any more.
	rolesets map[string]int
	swept    time.Time // the last pass over models for idle ones
}

type model struct {
	hist  histogram
	plans map[string]*plan
}

type plan struct {
	bands    []Band
	computed time.Time
	maxOf    map[string]int // roleset → highest band upper bound
}

// New returns a planner reading clock (the system clock when nil) and reporting to m (nil: none).
func New(clock load.Clock, m Metrics) *Planner {
	if clock == nil {
		clock = load.SystemClock{}
	}
	if m == nil {
		m = nopMetrics{}
	}
	return &Planner{clock: clock, metrics: m, models: map[string]*model{}, rolesets: map[string]int{}}
}

// Band records a routed prompt of promptLen tokens for the model and returns the roleset
// the current plan bands that length to, if any. groups are the model's eligible rolesets
// (their order does not matter). The band is advisory: the caller applies it only when
// that roleset still has both sides, then calls Routed.
func (p *Planner) Band(modelName string, mode Mode, promptLen int, groups []Group) (Band, bool) {
	now := p.clock.Now()
	gs := byName(groups)
	key := fingerprint(mode, gs)
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.swept) >= PlanTTL {
		p.forgetIdle(now)
	}
	m := p.models[modelName]
	if m == nil {
		m = &model{plans: map[string]*plan{}}
		p.models[modelName] = m
	}
	m.hist.observe(promptLen, now)
	pl := m.plans[key]
	if pl == nil || now.Sub(pl.computed) >= PlanTTL {
		m.hist.decay(now)
		next := &plan{bands: computeBands(m.hist.vector(mode), gs), computed: now, maxOf: map[string]int{}}
		for _, b := range next.bands {
			next.maxOf[b.Roleset] = max(next.maxOf[b.Roleset], b.Max)
		}
		p.replace(m, key, pl, next)
		pl = next
	}
	for _, b := range pl.bands {
		if promptLen >= b.Min && promptLen <= b.Max {
			return b, true
		}
	}
	return Band{}, false
}

// forgetIdle drops the models not routed for ModelIdleAfter, with their plans' gauges. It
// runs at most once per PlanTTL, so its cost (one pass over the models) stays off most
// requests. The caller holds p.mu.
func (p *Planner) forgetIdle(now time.Time) {
	p.swept = now
	for name, m := range p.models {
		if now.Sub(m.hist.at) >= ModelIdleAfter {
			for _, pl := range m.plans {
				p.release(pl)
			}
			delete(p.models, name)
		}
	}
}

// replace installs next under key (evicting the oldest plan past the limit) and keeps the
// band-max gauges in step: set for rolesets in next, deleted for rolesets no plan names.
func (p *Planner) replace(m *model, key string, old, next *plan) {
	if old == nil && len(m.plans) >= MaxPlansPerModel {
		oldestKey, oldest := "", (*plan)(nil)
		for k, pl := range m.plans {
			if oldest == nil || pl.computed.Before(oldest.computed) {
				oldestKey, oldest = k, pl
			}
		}
		delete(m.plans, oldestKey)
		p.release(oldest)
	}
	m.plans[key] = next
	for rs, mx := range next.maxOf {
		p.rolesets[rs]++
		p.metrics.SetBucketServeBandMax(rs, mx)
	}
	if old != nil {
		p.release(old)
	}
}

func (p *Planner) release(pl *plan) {
	for rs := range pl.maxOf {
		if p.rolesets[rs]--; p.rolesets[rs] <= 0 {
			delete(p.rolesets, rs)
			p.metrics.DropBucketServeRoleset(rs)
		}
	}
}

// Routed counts a request a band routed (pd_bucket_serve_band_total and
// pd_bucket_serve_prompt_tokens_total of the roleset).
func (p *Planner) Routed(b Band, promptTokens int) {
	p.metrics.BucketServeBand(b.Roleset, promptTokens)
}

// Bands returns the model's current plan for mode and groups without observing anything
// (for tests and debugging); nil when there is none.
func (p *Planner) Bands(modelName string, mode Mode, groups []Group) []Band {
	gs := byName(groups)
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := p.models[modelName]; m != nil {
		if pl := m.plans[fingerprint(mode, gs)]; pl != nil {
			return slices.Clone(pl.bands)
		}
	}
	return nil
}

// byName returns a copy of groups sorted by name, so the plan does not depend on order.
func byName(groups []Group) []Group {
	gs := slices.Clone(groups)
	slices.SortFunc(gs, func(a, b Group) int { return strings.Compare(a.Name, b.Name) })
	return gs
}
