package picker

import (
	"context"
	"math"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Profile is one scheduling profile: filters, weighted scorers and a picker.
type Profile struct {
	Name    string
	Filters []Filter
	Scorers []WeightedScorer
	// Picker ranks the scored endpoints; nil keeps them in filter order, for a handler
	// that ranks them itself (the PD pair is chosen across two profiles).
	Picker Picker
}

// WeightedScorer is a scorer with its weight in the profile's total.
type WeightedScorer struct {
	Scorer Scorer
	Weight float64
}

// ProfileResult is what one profile chose: Ranked[0] is its pick; Scored holds every
// endpoint that passed the filters, in filter order, with its weighted total (nil for a
// profile without a picker: its handler ranks the endpoints, in Ranked, itself).
type ProfileResult struct {
	Ranked []*pool.Endpoint
	Scored []ScoredEndpoint
}

// Filter runs the profile's filters over eps. When a filter leaves nothing it stops and
// names that filter.
func (p *Profile) Filter(ctx context.Context, c *Cycle, eps []*pool.Endpoint) ([]*pool.Endpoint, string) {
	for _, f := range p.Filters {
		eps = f.Filter(ctx, c, eps)
		if len(eps) == 0 {
			return nil, f.Name()
		}
	}
	return eps, ""
}

// Run filters, scores and picks. It fails with a 503 naming the filter that removed the
// last candidate.
func (p *Profile) Run(ctx context.Context, c *Cycle, eps []*pool.Endpoint) (*ProfileResult, error) {
	if len(eps) == 0 {
		return nil, apierror.Unavailable("no_endpoint", "profile %q: no candidate endpoint", p.Name)
	}
	eps, emptied := p.Filter(ctx, c, eps)
	if emptied != "" {
		return nil, apierror.Unavailable("no_endpoint", "profile %q: filter %q left no endpoint for the request", p.Name, emptied)
	}
	var scored []ScoredEndpoint
	if p.Picker != nil {
		scored = make([]ScoredEndpoint, len(eps))
		for i, e := range eps {
			scored[i].Endpoint = e
		}
	}
	if len(p.Scorers) > 0 {
		buf := make([]float64, len(eps))
		for _, ws := range p.Scorers {
			clear(buf)
			ws.Scorer.Score(ctx, c, eps, buf)
			if scored == nil {
				continue // the handler ranks: the scorers leave what it reads in the cycle
			}
			for i, s := range buf {
				scored[i].Score += ws.Weight * clamp01(s)
			}
		}
	}
	if p.Picker == nil {
		return &ProfileResult{Ranked: eps}, nil
	}
	ranked := p.Picker.Pick(ctx, c, scored)
	if len(ranked) == 0 {
		return nil, apierror.Unavailable("no_endpoint", "profile %q: picker %q chose no endpoint", p.Name, p.Picker.Name())
	}
	return &ProfileResult{Ranked: ranked, Scored: scored}, nil
}

// Plugins lists the profile's plugins: filters, scorers, then the picker.
func (p *Profile) Plugins() []Plugin {
	out := make([]Plugin, 0, len(p.Filters)+len(p.Scorers)+1)
	for _, f := range p.Filters {
		out = append(out, f)
	}
	for _, s := range p.Scorers {
		out = append(out, s.Scorer)
	}
	if p.Picker != nil {
		out = append(out, p.Picker)
	}
	return out
}

func clamp01(v float64) float64 {
	switch {
	case math.IsNaN(v) || v < 0:
		return 0
	case v > 1:
		return 1
	}
	return v
}
