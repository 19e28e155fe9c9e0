package picker

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
	"github.com/tandem-epp/tandem/internal/request"
)

// The extension points of a scheduling cycle, one small interface each. A strategy built
// from them runs: the ProfileHandler chooses which Profiles run; each Profile narrows the
// candidates with its Filters, scores the survivors with its weighted Scorers and lets its
// Picker rank them; PostPick hooks see the Decision; ResponseComplete hooks see the end of
// the request. Plugins are built by type name from a Registry.

// Plugin is anything a Registry builds. Type is the registry name, Name the instance name
// (a config file may declare two instances of one type with different parameters).
type Plugin interface {
	Type() string
	Name() string
}

// ProfileHandler chooses which profiles run for a request and turns their results into
// the endpoints the request goes to.
type ProfileHandler interface {
	Plugin
	// Next returns the profiles to run now, given the ones already run; none ends the cycle.
	Next(ctx context.Context, c *Cycle, profiles []*Profile, done map[string]*ProfileResult) []*Profile
	// Result names the destination (first, then fallbacks) and, for PD, the prefill target.
	Result(ctx context.Context, c *Cycle, done map[string]*ProfileResult) (destination, prefill []*pool.Endpoint, err error)
}

// Filter removes the endpoints that must not serve the request.
type Filter interface {
	Plugin
	Filter(ctx context.Context, c *Cycle, eps []*pool.Endpoint) []*pool.Endpoint
}

// Scorer rates each endpoint in [0, 1], higher is better; out has len(eps).
// Scores outside [0, 1] are clamped before they are weighted.
type Scorer interface {
	Plugin
	Score(ctx context.Context, c *Cycle, eps []*pool.Endpoint, out []float64)
}

// Picker ranks scored endpoints: the primary first, then fallbacks.
type Picker interface {
	Plugin
	Pick(ctx context.Context, c *Cycle, scored []ScoredEndpoint) []*pool.Endpoint
}

// PostPick runs after a decision is made, outside the selection critical section
// (prefix warming, accounting that must not delay the pick).
type PostPick interface {
	Plugin
	PostPick(ctx context.Context, c *Cycle, d *Decision)
}

// ResponseComplete runs once when the routed request ends (Lifecycle.Done).
type ResponseComplete interface {
	Plugin
	ResponseComplete(c *Cycle, d *Decision, err error)
}

// ScoredEndpoint is an endpoint with its weighted total score.
type ScoredEndpoint struct {
	Endpoint *pool.Endpoint
	Score    float64
}

// Cycle is one request's scheduling cycle: what every plugin may read, plus State for
// what plugins pass each other.
type Cycle struct {
	Req        *request.Request
	Snap       *pool.Snapshot
	Candidates []*pool.Endpoint
	Resolved   Resolved
	// PodRouting returns an endpoint's routingConfig for this request's profile.
	PodRouting func(*pool.Endpoint) config.RoutingConfig
	State      *CycleState

	// intn is the random source of this cycle's picks (Deps.Rand, set by Chain.Pick);
	// nil means math/rand/v2's global source.
	intn func(n int) int
}

// randN returns a random int in [0, n) from the cycle's source.
func (c *Cycle) randN(n int) int {
	if c != nil && c.intn != nil {
		return c.intn(n)
	}
	return rand.IntN(n)
}

// CycleState is per-request scratch shared by the plugins of one cycle. Safe for
// concurrent use (a PostPick may run on another goroutine).
type CycleState struct {
	mu sync.RWMutex
	m  map[string]any
}

// Read returns the value stored under key.
func (s *CycleState) Read(key string) (any, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.m[key]
	return v, ok
}

// Write stores a value under key.
func (s *CycleState) Write(key string, v any) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]any{}
	}
	s.m[key] = v
	s.mu.Unlock()
}

// Deps are the shared, long-lived signals plugins and strategies read. One set per
// process; every strategy sees the same counters so their views of load agree.
type Deps struct {
	// Running counts requests in flight per destination endpoint (the seed's
	// RealtimeNumRequestsRunning, kept by the gateway).
	Running *load.Tracker
	// Drain is the per-endpoint rate of completed requests over the last minute.
	Drain   *load.Rate
	Metrics *metrics.Store
	Prefix  *prefix.Index
	// Warmer, when set and running, applies prefix warms off the request path;
	// without it they are applied synchronously after the pick.
	Warmer *prefix.Warmer
	Clock  load.Clock
	// Rand, when set, is the source of every random choice the strategies built on these
	// deps make (ties, random picks): a virtual-time simulation seeds it so a run is
	// reproducible. It is called inside picks, so a source that is not safe for concurrent
	// use must not serve concurrent picks. Nil (production) uses math/rand/v2's global source.
	Rand func(n int) int

	// pruned is the newest snapshot version ForgetGone pruned for.
	pruned atomic.Uint64
}

// ForgetGone drops the Running and Drain entries of endpoints not in snap, once per
// snapshot newer than the last one pruned for: a request still holding an older snapshot
// must not forget endpoints that joined since. Every strategy calls it, so the shared
// signals do not keep an entry for every endpoint that ever existed.
func (d *Deps) ForgetGone(snap *pool.Snapshot) {
	if d == nil || snap == nil {
		return
	}
	old := d.pruned.Load()
	if snap.Version <= old || !d.pruned.CompareAndSwap(old, snap.Version) {
		return
	}
	live := make(map[string]struct{}, len(snap.Endpoints))
	for _, e := range snap.Endpoints {
		live[e.Key()] = struct{}{}
	}
	if d.Running != nil {
		for _, k := range d.Running.Keys() {
			if _, ok := live[k]; !ok {
				d.Running.Forget(k)
			}
		}
	}
	if d.Drain != nil {
		for _, k := range d.Drain.Keys() {
			if _, ok := live[k]; !ok {
				d.Drain.Forget(k)
			}
		}
	}
}

// NewDeps returns Deps with fresh counters, an empty metrics store and a prefix index
// bounded as pc says (zero fields take the index defaults), all reading clock (the system
// clock when nil). Set Warmer and run it to take prefix warming off the request path.
func NewDeps(clock load.Clock, pc config.PrefixCache) *Deps {
	if clock == nil {
		clock = load.SystemClock{}
	}
	return &Deps{
		Running: load.NewTracker(),
		Drain:   load.NewRate(clock),
		Metrics: metrics.NewStore(),
		Prefix:  prefix.NewIndex(prefix.Options{MaxBlocks: pc.MaxBlocks, Eviction: pc.EvictionDuration, Clock: clock}),
		Clock:   clock,
	}
}

// WarmPrefix records that key now holds the prompt's blocks, off the request path when a
// Warmer runs.
func (d *Deps) WarmPrefix(model string, hashes []uint64, key string) {
	if d.Prefix == nil || len(hashes) == 0 {
		return
	}
	if d.Warmer != nil {
		d.Warmer.Warm(model, hashes, key)
		return
	}
	d.Prefix.Add(model, hashes, key)
}
