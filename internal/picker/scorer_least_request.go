package picker

import (
	"context"
	"encoding/json"

	"github.com/tandem-epp/tandem/internal/pool"
)

// TypeLeastRequestScorer is Tandem's in-flight scorer.
const TypeLeastRequestScorer = "least-request-scorer"

// LeastRequestScorer scores 1 − inFlight/maxInFlight over the candidates (all 1 when idle),
// from the requests Tandem itself has in flight on each endpoint.
type LeastRequestScorer struct {
	TypedName
	deps *Deps
}

// NewLeastRequestScorer returns the scorer over deps' in-flight counts.
func NewLeastRequestScorer(d *Deps) *LeastRequestScorer {
	return &LeastRequestScorer{NewTypedName(TypeLeastRequestScorer, ""), d}
}

func newLeastRequestScorer(name string, raw json.RawMessage, h *Handle) (Plugin, error) {
	if err := DecodeParams(raw, nil); err != nil {
		return nil, err
	}
	return &LeastRequestScorer{NewTypedName(TypeLeastRequestScorer, name), h.Deps}, nil
}

// Score implements Scorer.
func (s *LeastRequestScorer) Score(_ context.Context, _ *Cycle, eps []*pool.Endpoint, out []float64) {
	var hi int64
	for i, e := range eps {
		n := s.deps.Running.InFlightOf(e)
		out[i] = float64(n)
		hi = max(hi, n)
	}
	for i := range out {
		if hi == 0 {
			out[i] = 1
		} else {
			out[i] = 1 - out[i]/float64(hi)
		}
	}
}
