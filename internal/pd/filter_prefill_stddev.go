package pd

import (
	"context"
	"encoding/json"
	"math"

	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// TypeStddevFilter is step 3's standard-deviation skip.
const TypeStddevFilter = "prefill-stddev-filter"

type stddevParams struct {
	Factor *float64 `json:"factor" default:"AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR (1)" doc:"N: prefill pods with more requests in flight than mean + N · sample std are skipped; negative disables the skip."`
}

// StddevFilter is step 3's skip: it drops the prefill pods whose in-flight count is above
// mean + N·(sample std) over the candidates. It is a scoring-only filter: the roleset
// handler applies it in its scoring round, over the batch left after the fast paths, and
// lifts it when it leaves no roleset with both sides (trace step stddev_skip_ignored).
type StddevFilter struct {
	picker.TypedName
	c      *Cascade
	factor *float64
}

func (c *Cascade) newStddevFilter(name string, raw json.RawMessage, _ *picker.Handle) (picker.Plugin, error) {
	var p stddevParams
	if err := picker.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	return &StddevFilter{picker.NewTypedName(TypeStddevFilter, name), c, p.Factor}, nil
}

// ScoringOnly marks the filter as one the roleset handler does not run when sorting the
// candidates into rolesets.
func (f *StddevFilter) ScoringOnly() {}

// Filter implements picker.Filter.
func (f *StddevFilter) Filter(_ context.Context, cy *picker.Cycle, eps []*pool.Endpoint) []*pool.Endpoint {
	s := selectionOf(cy)
	if s.scoring() {
		if s.relaxed {
			return eps
		}
		n := s.pb.Knobs.PrefixCache.StandardDeviationFactor
		if f.factor != nil {
			n = *f.factor
		}
		limit := stddevLimit(s.pb.Pods, n)
		if math.IsInf(limit, 1) {
			return eps
		}
		return keepBatch(eps, s.pb.Pods, limit)
	}
	// Outside the roleset handler: the same rule over the endpoints given.
	pods := make([]PrefillPod, len(eps))
	for i, e := range eps {
		pods[i] = PrefillPod{Endpoint: e, InFlight: float64(f.c.prefill.InFlightOf(e))}
	}
	n := cy.Resolved.PD.PrefixCache.StandardDeviationFactor
	if f.factor != nil {
		n = *f.factor
	}
	limit := stddevLimit(pods, n)
	return keepBatch(eps, pods, limit)
}

// keepBatch keeps the endpoints of eps (an ordered subsequence of pods: the scoring round's
// endpoints are the batch's, in its order) whose pod has at most limit requests in flight;
// an endpoint not in the batch is kept. One pass; eps itself when all are kept.
func keepBatch(eps []*pool.Endpoint, pods []PrefillPod, limit float64) []*pool.Endpoint {
	var out []*pool.Endpoint
	j := 0
	for i, e := range eps {
		k := j
		for k < len(pods) && pods[k].Endpoint != e {
			k++
		}
		keep := k == len(pods) || pods[k].InFlight <= limit
		if k < len(pods) {
			j = k + 1
		}
		switch {
		case keep && out != nil:
			out = append(out, e)
		case !keep && out == nil:
			out = make([]*pool.Endpoint, i, len(eps)-1)
			copy(out, eps[:i])
		}
	}
	if out == nil {
		return eps
	}
	return out
}
