package pd

import (
	"fmt"
	"math"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Combined ("standard") pods in the PD strategy: the fallback when no complete roleset is
// left, and the overflow target of step 0b.

// noPair handles "no complete roleset": a combined pod chosen at random, else a 503.
// Without bucketing the seed has no combined fallback; Tandem still uses a configured
// combined pod rather than failing (the seed's overview promises that fallback).
func (c *Cascade) noPair(cy *picker.Cycle, s *selection, fallbacks int) (*picker.Decision, error) {
	if len(s.pt.combined) > 0 {
		step := StepCombinedNoRoleset
		if s.pt.bucketed {
			step = StepCombinedNoBucket
		}
		order := make([]*pool.Endpoint, len(s.pt.combined))
		copy(order, s.pt.combined)
		for i := len(order) - 1; i > 0; i-- {
			j := c.rand(i + 1)
			order[i], order[j] = order[j], order[i]
		}
		return c.combinedDecision(s, step, order, fallbacks), nil
	}
	if s.pt.bucketed && (s.pt.nPrefill > 0 && s.pt.nDecode > 0) {
		return nil, apierror.Unavailable("no_bucket_match",
			"no prompt-length bucket matches prompt length %d tokens and no combined pod covers it; "+
				"widen promptLenBucketMinLength/promptLenBucketMaxLength or add a combined: true pod", promptLength(cy))
	}
	return nil, apierror.Unavailable("no_pd_pair",
		"no complete prefill/decode roleset among %d candidates (prefill pods %d, decode pods %d, incomplete rolesets %d) "+
			"and no combined pod; pair prefill and decode pods with the same roleset-name, or use another routing-strategy",
		len(cy.Candidates), s.pt.nPrefill, s.pt.nDecode, s.pt.incomplete)
}

func (c *Cascade) combinedDecision(s *selection, step string, ranked []*pool.Endpoint, fallbacks int) *picker.Decision {
	ranked = ranked[:min(len(ranked), fallbacks+1)]
	s.trace.Add(step)
	d := &picker.Decision{Outcome: picker.OutcomeCombined, Step: step, Destination: ranked, Trace: s.trace}
	newWholeLifecycle(c, ranked, s.promptTokens).adopt(d)
	return d
}

// combinedScore is the seed's queue-drain ratio of a pod:
// (waiting + prefill prealloc queue + decode prealloc queue) / drain rate.
// Missing metrics count as 0. The drain rate is floored at 0.01 requests/s (the floor
// the seed's own Prometheus query applies), so an idle pod that completed nothing scores
// 0 (idle) instead of 0/0, and a pod with a backlog but no completions scores 100× its
// backlog (saturated) instead of +Inf.
func (c *Cascade) combinedScore(e *pool.Endpoint) float64 {
	var backlog float64
	if smp := c.deps.Metrics.Get(e.Key()); smp != nil {
		if smp.HasWaiting {
			backlog += smp.Waiting
		}
		if smp.HasPreallocQueues {
			backlog += smp.PrefillPreallocQueue + smp.DecodePreallocQueue
		}
	}
	drain := 0.0
	if c.deps.Drain != nil {
		drain = c.deps.Drain.PerSecond(e.Key())
	}
	return backlog / math.Max(drain, combinedDrainFloor)
}

// rankCombined orders combined pods by combinedScore, lowest first, ties at random, and
// records the scores in the trace.
func (c *Cascade) rankCombined(s *selection, eps []*pool.Endpoint) []*pool.Endpoint {
	type sc struct {
		e   *pool.Endpoint
		s   float64
		tie int
	}
	xs := make([]sc, len(eps))
	for i, e := range eps {
		xs[i] = sc{e, c.combinedScore(e), c.rand(1 << 30)}
	}
	sortBy(xs, func(a, b sc) bool { return a.s < b.s || (a.s == b.s && a.tie < b.tie) })
	out := make([]*pool.Endpoint, len(xs))
	s.trace.Scores = make(map[string]string, min(len(xs), maxTracedRolesets))
	s.trace.ScoreDirection = picker.LowerIsBetter
	for i := range xs {
		out[i] = xs[i].e
		if i < maxTracedRolesets {
			s.trace.Scores["combined "+xs[i].e.Key()] = fmt.Sprintf("%.4f", xs[i].s)
		}
	}
	return out
}
