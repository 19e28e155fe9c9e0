package pd

import (
	"math"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/metrics"
)

// kv_cache_utilization, worked by hand. The batch's KV per running request is the scraped
// usage over the scraped running requests of the pods that report both:
// (30 + 10 + 50 + 10) / (3 + 1 + 5 + 1) = 10 % a request.
func TestKVCacheUtilizationScores(t *testing.T) {
	scraped := func(usage, running float64) *metrics.Sample {
		return &metrics.Sample{KVUsage: usage, HasKVUsage: true, Running: running, HasRunning: true}
	}
	b := &DecodeBatch{Pods: []DecodePod{
		{Sample: scraped(0.30, 3), Running: 3, Pending: 1},                    // one picked since the scrape: 30 + 10·(4 − 3)
		{Sample: scraped(0.10, 1), Running: 1},                                // as scraped: 10
		{Pending: 2},                                                          // never scraped, two picked: 10·2
		{Sample: scraped(0.50, 5), Running: 2},                                // three ended since: 50 + 10·(2 − 5)
		{Sample: &metrics.Sample{KVUsage: 0.9, HasKVUsage: true}, Running: 1}, // usage without its running count: 10·1
		{Sample: scraped(0.10, 1)},                                            // its request ended, nothing since: 10 + 10·(0 − 1)
	}}
	want := []float64{40, 10, 20, 20, 10, 0}
	for i, w := range want {
		if got := (kvCacheUtilizationDecode{}).Score(b, i); math.Abs(got-w) > 1e-9 {
			t.Errorf("pod %d: %.4f, want %.4f", i, got, w)
		}
	}
	// Nothing running anywhere: every pod is empty, whatever the gateway counts.
	idle := &DecodeBatch{Pods: []DecodePod{{Sample: scraped(0, 0), Pending: 3}, {}}}
	for i := range idle.Pods {
		if got := (kvCacheUtilizationDecode{}).Score(idle, i); got != 0 {
			t.Errorf("idle pool, pod %d: %.4f, want 0", i, got)
		}
	}
}

// Named in AIBRIX_DECODE_SCORE_POLICY, the policy decides the pair's decode pod, and picks
// between two scrapes spread over the pods as their estimates grow: four decode pods at 20,
// 25, 30 and 35 % with one request each (27.5 % a request) take three of twelve picks each,
// in turn. A pod never scraped with many requests in flight gets none.
func TestKVCacheUtilizationSpreadsBetweenScrapes(t *testing.T) {
	h := newHarness(t, gateway(func(g *config.PD) {
		g.PrefillScorePolicy = PolicyLeastRequest
		g.DecodeScorePolicy = PolicyKVCacheUtilization
	}), P("p", "A"), D("d1", "A"), D("d2", "A"), D("d3", "A"), D("d4", "A"), D("stale", "A"))
	for i, usage := range []float64{0.20, 0.25, 0.30, 0.35} {
		name := []string{"d1", "d2", "d3", "d4"}[i]
		h.sample(name, metrics.Sample{KVUsage: usage, HasKVUsage: true, Running: 1, HasRunning: true})
		h.running(name, 1)
	}
	h.running("stale", 15)
	got := map[string]int{}
	for range 12 {
		got[first(h.mustPick(prompt("x", 8)).Destination)]++
	}
	for _, d := range []string{"d1", "d2", "d3", "d4"} {
		if got[d] != 3 {
			t.Errorf("picks per decode pod %v; want 3 on each of d1..d4 and none on stale", got)
			break
		}
	}
}
