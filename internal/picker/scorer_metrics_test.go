package picker

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
)

// The metric scorers with llm-d's and GIE's formulas, worked by hand over three pods waiting
// 0, 4 and 10 with 10 %, 50 % and 95 % KV cache used (a fourth never scraped reads as 0).
func TestMetricScorers(t *testing.T) {
	deps := NewDeps(nil, config.PrefixCache{})
	var eps []*pool.Endpoint
	for i, s := range []*metrics.Sample{
		{Waiting: 0, HasWaiting: true, KVUsage: 0.1, HasKVUsage: true},
		{Waiting: 4, HasWaiting: true, KVUsage: 0.5, HasKVUsage: true},
		{Waiting: 10, HasWaiting: true, KVUsage: 0.95, HasKVUsage: true},
		nil,
	} {
		e := pool.NewEndpoint("ns", fmt.Sprint("p", i), "10.0.0.1", int32(8000+i), 0, nil, nil)
		if s != nil {
			deps.Metrics.Put(e.Key(), s)
		}
		eps = append(eps, e)
	}
	cases := []struct {
		typ, params string
		want        []float64
	}{
		// (max − waiting) / (max − min), max 10, min 0.
		{TypeQueueScorer, "", []float64{1, 0.6, 0, 1}},
		// 1 − KV usage.
		{TypeKVCacheUtilizationScorer, "", []float64{0.9, 0.5, 0.05, 1}},
		// 0.5 for an empty queue, else 0.5·(1 − min(w, 128)/128).
		{TypeLoadAwareScorer, "", []float64{0.5, 0.5 * (1 - 4.0/128), 0.5 * (1 - 10.0/128), 0.5}},
		// threshold 8: 10 is capped at 8 → 0.
		{TypeLoadAwareScorer, `{"threshold": 8}`, []float64{0.5, 0.25, 0, 0.5}},
	}
	for _, tc := range cases {
		t.Run(tc.typ+tc.params, func(t *testing.T) {
			p, err := NewRegistry().New(tc.typ, "", json.RawMessage(tc.params), deps)
			if err != nil {
				t.Fatal(err)
			}
			out := make([]float64, len(eps))
			p.(Scorer).Score(context.Background(), &Cycle{}, eps, out)
			for i := range out {
				if math.Abs(out[i]-tc.want[i]) > 1e-12 {
					t.Fatalf("scores %v, want %v", out, tc.want)
				}
			}
		})
	}
	// Equal queues: every pod scores 1 (GIE and llm-d).
	q, _ := NewRegistry().New(TypeQueueScorer, "", nil, deps)
	out := make([]float64, 1)
	q.(Scorer).Score(context.Background(), &Cycle{}, eps[:1], out)
	if out[0] != 1 {
		t.Fatalf("one pod: %v", out)
	}
}
