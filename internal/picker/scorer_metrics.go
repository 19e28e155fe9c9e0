package picker

import (
	"context"
	"encoding/json"

	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Scorers over the engines' scraped metrics, as llm-d and GIE define them. A pod never
// scraped (or stale) reads as zero, as it does there.
const (
	TypeQueueScorer              = "queue-scorer"
	TypeKVCacheUtilizationScorer = "kv-cache-utilization-scorer"
	TypeLoadAwareScorer          = "load-aware-scorer"
)

func sample(d *Deps, e *pool.Endpoint) *metrics.Sample {
	if d == nil || d.Metrics == nil {
		return nil
	}
	return d.Metrics.Get(e.Key())
}

func waiting(d *Deps, e *pool.Endpoint) float64 {
	if s := sample(d, e); s != nil && s.HasWaiting {
		return s.Waiting
	}
	return 0
}

// QueueScorer is queue-scorer: (max − waiting) / (max − min) over the candidates' waiting
// queues, 1 for all when they are equal.
type QueueScorer struct {
	TypedName
	deps *Deps
}

// Score implements Scorer.
func (s *QueueScorer) Score(_ context.Context, _ *Cycle, eps []*pool.Endpoint, out []float64) {
	lo, hi := 0.0, 0.0
	for i, e := range eps {
		w := waiting(s.deps, e)
		out[i] = w
		if i == 0 || w < lo {
			lo = w
		}
		if i == 0 || w > hi {
			hi = w
		}
	}
	for i := range out {
		if hi == lo {
			out[i] = 1
		} else {
			out[i] = (hi - out[i]) / (hi - lo)
		}
	}
}

// KVCacheUtilizationScorer is kv-cache-utilization-scorer: 1 − KV-cache usage (0..1).
type KVCacheUtilizationScorer struct {
	TypedName
	deps *Deps
}

// Score implements Scorer.
func (s *KVCacheUtilizationScorer) Score(_ context.Context, _ *Cycle, eps []*pool.Endpoint, out []float64) {
	for i, e := range eps {
		out[i] = 1
		if smp := sample(s.deps, e); smp != nil && smp.HasKVUsage {
			out[i] = 1 - smp.KVUsage
		}
	}
}

// loadAwareParams are llm-d's load-aware-scorer parameters.
type loadAwareParams struct {
	Threshold int `json:"threshold" default:"128" doc:"Waiting requests at which a pod scores 0; must be positive."`
}

// LoadAwareScorer is llm-d's load-aware-scorer: 0.5 for an empty queue, else
// 0.5 · (1 − min(waiting, threshold) / threshold).
type LoadAwareScorer struct {
	TypedName
	deps      *Deps
	threshold float64
}

// Score implements Scorer.
func (s *LoadAwareScorer) Score(_ context.Context, _ *Cycle, eps []*pool.Endpoint, out []float64) {
	for i, e := range eps {
		w := waiting(s.deps, e)
		if w == 0 {
			out[i] = 0.5
			continue
		}
		out[i] = 0.5 * (1 - min(w, s.threshold)/s.threshold)
	}
}

func newMetricScorer(typ string) Factory {
	return func(name string, raw json.RawMessage, h *Handle) (Plugin, error) {
		tn := NewTypedName(typ, name)
		switch typ {
		case TypeLoadAwareScorer:
			p := loadAwareParams{Threshold: 128}
			if err := DecodeParams(raw, &p); err != nil {
				return nil, err
			}
			if p.Threshold <= 0 {
				return nil, BadParam("threshold", p.Threshold, "must be positive")
			}
			return &LoadAwareScorer{tn, h.Deps, float64(p.Threshold)}, nil
		case TypeKVCacheUtilizationScorer:
			if err := DecodeParams(raw, nil); err != nil {
				return nil, err
			}
			return &KVCacheUtilizationScorer{tn, h.Deps}, nil
		}
		if err := DecodeParams(raw, nil); err != nil {
			return nil, err
		}
		return &QueueScorer{tn, h.Deps}, nil
	}
}
