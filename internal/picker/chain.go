package picker

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Strategy is one routing strategy (the routing-strategy header's values): it turns a
// cycle into a Decision. The Router fills Decision.Strategy and the echoed header.
type Strategy interface {
	Name() string
	Pick(ctx context.Context, c *Cycle) (*Decision, error)
}

// Chain is a Strategy assembled from plugins: a profile handler, its profiles, and hooks.
type Chain struct {
	StrategyName     string
	Handler          ProfileHandler
	Profiles         []*Profile
	PostPicks        []PostPick
	ResponseComplete []ResponseComplete
	Deps             *Deps
}

// Name implements Strategy.
func (s *Chain) Name() string { return s.StrategyName }

// Pick implements Strategy.
func (s *Chain) Pick(ctx context.Context, c *Cycle) (*Decision, error) {
	s.Deps.ForgetGone(c.Snap)
	if s.Deps != nil && s.Deps.Rand != nil {
		c.intn = s.Deps.Rand
	}
	done := map[string]*ProfileResult{}
	for round := 0; ; round++ {
		next := s.Handler.Next(ctx, c, s.Profiles, done)
		if len(next) == 0 {
			break
		}
		if round > len(s.Profiles) {
			return nil, apierror.Internal("profile_loop", "strategy %q: profile handler %q keeps asking for profiles", s.StrategyName, s.Handler.Name())
		}
		for _, p := range next {
			r, err := p.Run(ctx, c, c.Candidates)
			if err != nil {
				return nil, err
			}
			done[p.Name] = r
		}
	}
	dest, prefill, err := s.Handler.Result(ctx, c, done)
	if err != nil {
		return nil, apierror.Unavailable("no_endpoint", "strategy %q: %v", s.StrategyName, err)
	}
	if len(dest) == 0 {
		return nil, apierror.Unavailable("no_endpoint", "strategy %q chose no endpoint", s.StrategyName)
	}
	outcome := OutcomeSingle
	if len(prefill) > 0 {
		outcome = OutcomePD
	}
	d := &Decision{Outcome: outcome, Step: s.StrategyName, Destination: dest, Prefill: prefill,
		Trace: &Trace{Candidates: len(c.Candidates)}}
	d.Trace.Add(s.StrategyName)
	// The trace carries the scores of the ranked endpoints only: bounded, and what explains
	// the choice.
	for _, r := range done {
		for _, se := range r.Scored {
			if slices.Contains(r.Ranked, se.Endpoint) {
				if d.Trace.Scores == nil {
					d.Trace.Scores = map[string]string{}
				}
				d.Trace.Scores[se.Endpoint.Key()] = fmt.Sprintf("%.4f", se.Score)
			}
		}
	}
	for _, h := range s.PostPicks {
		h.PostPick(ctx, c, d)
	}
	d.Lifecycle = NewTracked(s.Deps, dest[0], func(err error) {
		for _, h := range s.ResponseComplete {
			h.ResponseComplete(c, d, err)
		}
	})
	return d, nil
}

// Tracked is the Lifecycle of a single-endpoint decision: the request counts as running
// on the endpoint from the pick until Done, and its completion feeds the drain rate.
type Tracked struct {
	once    sync.Once
	release func()
	key     string
	deps    *Deps
	onDone  func(error)
}

// NewTracked starts counting a request on e; onDone (may be nil) runs once at Done.
func NewTracked(d *Deps, e *pool.Endpoint, onDone func(error)) *Tracked {
	return &Tracked{release: d.Running.Start(e.Key()), key: e.Key(), deps: d, onDone: onDone}
}

// ResponseHeaders implements Lifecycle.
func (t *Tracked) ResponseHeaders(int, string) {}

// ResponseBody implements Lifecycle.
func (t *Tracked) ResponseBody(int, bool) {}

// Done implements Lifecycle; calls after the first are ignored.
func (t *Tracked) Done(err error) {
	t.once.Do(func() {
		t.release()
		if t.deps.Drain != nil {
			t.deps.Drain.Record(t.key)
		}
		if t.onDone != nil {
			t.onDone(err)
		}
	})
}
