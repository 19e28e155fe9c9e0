package picker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Strategy is one routing strategy (the routing-strategy header's values): it turns a
// cycle into a Decision. The Router fills Decision.Strategy and the echoed header.
type Strategy interface {
	Name() string
	Pick(ctx context.Context, c *Cycle) (*Decision, error)
}

// Chain is a Strategy assembled from plugins: a profile handler, its profiles, and hooks.
// Build it with NewChain, which collects the hooks from the plugins themselves.
type Chain struct {
	StrategyName string
	Handler      ProfileHandler
	Profiles     []*Profile
	// Producers run first, outside the critical section; Reservers inside it, after the
	// decision; PostPicks after it; ResponseComplete at the end of the request.
	Producers        []DataProducer
	Reservers        []Reserver
	PostPicks        []PostPick
	ResponseComplete []ResponseComplete
	Deps             *Deps
}

// NewChain assembles a chain and gives every plugin of the handler and the profiles the
// hooks it implements (a plugin named twice gets each hook once). It binds the handler to
// the profiles when the handler needs named profiles.
func NewChain(name string, h ProfileHandler, profiles []*Profile, deps *Deps, extra ...Plugin) (*Chain, error) {
	c := &Chain{StrategyName: name, Handler: h, Profiles: profiles, Deps: deps}
	if b, ok := h.(ProfileBinder); ok {
		if err := b.Bind(profiles); err != nil {
			return nil, err
		}
	}
	seen := map[Plugin]bool{}
	add := func(p Plugin) {
		if p == nil || seen[p] {
			return
		}
		seen[p] = true
		if x, ok := p.(DataProducer); ok {
			c.Producers = append(c.Producers, x)
		}
		if x, ok := p.(Reserver); ok {
			c.Reservers = append(c.Reservers, x)
		}
		if x, ok := p.(PostPick); ok {
			c.PostPicks = append(c.PostPicks, x)
		}
		if x, ok := p.(ResponseComplete); ok {
			c.ResponseComplete = append(c.ResponseComplete, x)
		}
	}
	add(h) // the handler's producer runs first: profiles' producers may read what it wrote
	for _, p := range extra {
		add(p)
	}
	for _, p := range profiles {
		for _, pl := range p.Plugins() {
			add(pl)
		}
	}
	return c, nil
}

// Name implements Strategy.
func (s *Chain) Name() string { return s.StrategyName }

// Pick implements Strategy.
func (s *Chain) Pick(ctx context.Context, c *Cycle) (*Decision, error) {
	if s.Deps != nil && s.Deps.Rand != nil {
		c.intn = s.Deps.Rand
	}
	if c.State == nil {
		c.State = &CycleState{}
	}
	for _, p := range s.Producers {
		if err := p.Produce(ctx, c); err != nil {
			return nil, apierror.From(err)
		}
	}
	d, done, err := s.decideExclusive(ctx, c)
	if err != nil {
		return nil, err
	}
	s.fill(c, d, done)
	for _, h := range s.PostPicks {
		h.PostPick(ctx, c, d)
	}
	if d.Lifecycle == nil {
		t := NewTracked(s.Deps, d.Destination[0], c.Req.PromptTokens, func(err error) {
			for _, h := range s.ResponseComplete {
				h.ResponseComplete(c, d, err)
			}
		})
		t.dest = d.Destination
		d.Lifecycle, d.Route = t, t.route
	}
	return d, nil
}

// decideExclusive runs decide and the Reservers inside the handler's critical section, when
// it has one. The lock is released however the section ends: a plugin that panics fails its
// request (the stream recovers the panic) and must not block every later pick.
func (s *Chain) decideExclusive(ctx context.Context, c *Cycle) (*Decision, map[string]*ProfileResult, error) {
	if ex, ok := s.Handler.(Exclusive); ok {
		if lock := ex.CriticalSection(); lock != nil {
			lock.Lock()
			defer lock.Unlock()
		}
	}
	d, done, err := s.decide(ctx, c)
	if err == nil {
		for _, r := range s.Reservers {
			r.Reserve(ctx, c, d)
		}
	}
	return d, done, err
}

// decide runs the handler's rounds and its Result, and keeps prefill-only pods out of the
// destination (whatever the handler: a non-PD strategy must never send a whole request to
// a pod that only runs prefill).
func (s *Chain) decide(ctx context.Context, c *Cycle) (*Decision, map[string]*ProfileResult, error) {
	done := make(map[string]*ProfileResult, 4)
	for round := 0; ; round++ {
		next := s.Handler.Next(ctx, c, s.Profiles, done)
		if len(next) == 0 {
			break
		}
		if round > 2*len(s.Profiles)+1 {
			return nil, nil, apierror.Internal("profile_loop", "strategy %q: profile handler %q keeps asking for profiles", s.StrategyName, s.Handler.Name())
		}
		for _, run := range next {
			eps := run.Endpoints
			if eps == nil {
				eps = c.Candidates
			}
			r, err := run.Profile.Run(ctx, c, eps)
			if err != nil {
				return nil, nil, err
			}
			done[run.Profile.Name] = r
		}
	}
	d, err := s.Handler.Result(ctx, c, done)
	if err != nil {
		var ae *apierror.Error
		if errors.As(err, &ae) {
			return nil, nil, ae
		}
		return nil, nil, apierror.Unavailable("no_endpoint", "strategy %q: %v", s.StrategyName, err)
	}
	if d == nil || len(d.Destination) == 0 {
		return nil, nil, apierror.Unavailable("no_endpoint", "strategy %q chose no endpoint", s.StrategyName)
	}
	if slices.ContainsFunc(d.Destination, prefillOnly) {
		d.Destination = slices.DeleteFunc(slices.Clone(d.Destination), prefillOnly)
		if len(d.Destination) == 0 {
			return nil, nil, apierror.Unavailable("no_endpoint",
				"strategy %q chose only prefill-only pods, which cannot serve a whole request; add a decode-filter to its profile, or use the pd strategy", s.StrategyName)
		}
	}
	return d, done, nil
}

func prefillOnly(e *pool.Endpoint) bool { return e.Role == pool.RolePrefill }

// fill completes what the handler left empty.
func (s *Chain) fill(c *Cycle, d *Decision, done map[string]*ProfileResult) {
	if d.Outcome == "" {
		d.Outcome = OutcomeSingle
		if len(d.Prefill) > 0 {
			d.Outcome = OutcomePD
		}
	}
	if d.Step == "" {
		d.Step = s.StrategyName
	}
	// A handler may leave a trace of its own steps only (no Candidates): the strategy's name
	// goes first and the scores are added, as for a handler that leaves none.
	if d.Trace == nil || d.Trace.Candidates == 0 {
		own := d.Trace
		d.Trace = &Trace{Candidates: len(c.Candidates)}
		d.Trace.Add(s.StrategyName)
		if d.Trace.Scores = RankedScores(done); d.Trace.Scores != nil {
			d.Trace.ScoreDirection = HigherIsBetter
		}
		if own != nil {
			d.Trace.Steps = append(d.Trace.Steps, own.Steps...)
			d.Trace.Unpaired = own.Unpaired
		}
	}
}

// RankedScores formats the weighted totals of the endpoints the profiles ranked (bounded,
// and what explains the choice), for a decision's trace; nil when there are none.
func RankedScores(done map[string]*ProfileResult) map[string]string {
	var out map[string]string
	for _, r := range done {
		if r == nil {
			continue
		}
		for _, se := range r.Scored {
			if slices.Contains(r.Ranked, se.Endpoint) {
				if out == nil {
					out = map[string]string{}
				}
				out[se.Endpoint.Key()] = fmt.Sprintf("%.4f", se.Score)
			}
		}
	}
	return out
}

// Tracked is the Lifecycle of a single-endpoint decision: the request counts as running
// on the endpoint from the pick until Done (on the fallback that served, once the gateway
// says one did), its completion feeds the drain rate, and its events go to the outcome
// record.
type Tracked struct {
	once    sync.Once
	mu      sync.Mutex // guards release and key against a late ResponseHeaders
	release func()
	key     string
	drain   *load.Series     // key's drain series, taken with its count
	dest    []*pool.Endpoint // the decision's destinations: the primary, then fallbacks
	deps    *Deps
	onDone  func(error)
	route   *outcome.Tracker
	done    bool
}

// NewTracked starts counting a request of promptTokens on e; onDone (may be nil) runs
// once at Done.
func NewTracked(d *Deps, e *pool.Endpoint, promptTokens int, onDone func(error)) *Tracked {
	return &Tracked{release: d.Running.Start(e.Key()), key: e.Key(), drain: d.Drain.Series(e.Key()), deps: d, onDone: onDone,
		route: d.Outcomes.Start(outcome.KindWhole, "", e.Key(), promptTokens)}
}

// ResponseHeaders implements Lifecycle. When the endpoint that answered is one of the
// fallbacks, the request's running count moves there and the outcome record names it (the
// latency models and passive health time the pod that answered, not the primary the
// gateway could not use).
func (t *Tracked) ResponseHeaders(status int, served *pool.Endpoint) {
	t.route.Response(status, t.moveTo(served))
}

// moveTo moves the running count to the served endpoint when it is one of the fallbacks, and
// returns the endpoint counted (the lock is released even if a tracker panics).
func (t *Tracked) moveTo(served *pool.Endpoint) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := served; !t.done && e != nil && e.Key() != t.key {
		t.release()
		t.key, t.release, t.drain = e.Key(), t.deps.Running.Start(e.Key()), t.deps.Drain.Series(e.Key())
	}
	return t.key
}

// ResponseBody implements Lifecycle.
func (t *Tracked) ResponseBody(size int, _ bool) { t.route.Chunk(size) }

// Done implements Lifecycle; calls after the first are ignored.
func (t *Tracked) Done(err error) {
	t.route.End(err)
	t.once.Do(func() {
		release, drain := t.markDone()
		release()
		t.deps.Drain.RecordTo(drain)
		if t.onDone != nil {
			t.onDone(err)
		}
	})
}

func (t *Tracked) markDone() (release func(), drain *load.Series) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	return t.release, t.drain
}
