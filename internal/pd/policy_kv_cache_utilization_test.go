package pd

import (
	"math"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/metrics"
)

// kv_cache_utilization, worked by hand. The batch's KV per running request is the scraped
// usage over the scraped running requests of the pods that report both:
// (30 + 10 + 50 + 10) / (3 + 1 + 5 + 1) = 10 % a request. Requests beyond the engine's count
// add to the scraped usage; fewer (ended since, or counted by another replica) take nothing off.
func TestKVCacheUtilizationScores(t *testing.T) {
	scraped := func(usage, running float64) *metrics.Sample {
		return &metrics.Sample{KVUsage: usage, HasKVUsage: true, Running: running, HasRunning: true}
	}
	b := &DecodeBatch{Pods: []DecodePod{
		{Sample: scraped(0.30, 3), Running: 3, Pending: 1},                    // one picked since the scrape: 30 + 10·(4 − 3)
		{Sample: scraped(0.10, 1), Running: 1},                                // as scraped: 10
		{Pending: 2},                                                          // never scraped, two picked: 10·2
		{Sample: scraped(0.50, 5), Running: 2},                                // three ended since (or are another replica's): 50
		{Sample: &metrics.Sample{KVUsage: 0.9, HasKVUsage: true}, Running: 1}, // usage without its running count: 10·1
		{Sample: scraped(0.10, 1)},                                            // as scraped: 10
	}}
	want := []float64{40, 10, 20, 50, 10, 10}
	for i, w := range want {
		// requestTieBreak per request on top, too small to show at this precision
		if got := (kvCacheUtilizationDecode{}).Score(b, i); math.Abs(got-w) > 1e-4 {
			t.Errorf("pod %d: %.4f, want %.4f", i, got, w)
		}
	}
	// Equal estimates go to the pod with fewer requests: pods 1 and 5 differ by one.
	if a, c := (kvCacheUtilizationDecode{}).Score(b, 5), (kvCacheUtilizationDecode{}).Score(b, 1); !(a < c) {
		t.Errorf("equal KV: the pod without requests scores %v, not below the one with one (%v)", a, c)
	}
	// Nothing running anywhere: no KV per request is known; the requests order the pods.
	idle := &DecodeBatch{Pods: []DecodePod{{Sample: scraped(0, 0), Pending: 3}, {}}}
	if a, c := (kvCacheUtilizationDecode{}).Score(idle, 0), (kvCacheUtilizationDecode{}).Score(idle, 1); !(c < a) || a > 1e-4 {
		t.Errorf("idle pool: %v with 3 pending, %v with none; want the second lower, both about 0", a, c)
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

// An idle pool, every scrape showing no KV in use: no KV per request is known yet, and the
// requests sent since order the pods, so a burst within one scrape interval spreads and
// leaves the pod already holding 30 requests alone.
func TestKVCacheUtilizationSpreadsABurstOnAnIdlePool(t *testing.T) {
	h := newHarness(t, gateway(func(g *config.PD) {
		g.PrefillScorePolicy = PolicyLeastRequest
		g.DecodeScorePolicy = PolicyKVCacheUtilization
	}), P("p", "A"), D("d1", "A"), D("d2", "A"), D("d3", "A"), D("d4", "A"))
	for _, name := range []string{"d1", "d2", "d3", "d4"} {
		h.sample(name, metrics.Sample{KVUsage: 0, HasKVUsage: true, Running: 0, HasRunning: true})
	}
	h.running("d1", 30)
	got := map[string]int{}
	for range 12 {
		got[first(h.mustPick(prompt("x", 8)).Destination)]++
	}
	if got["d1"] != 0 || got["d2"] != 4 || got["d3"] != 4 || got["d4"] != 4 {
		t.Errorf("picks per decode pod %v; want 4 on each of d2..d4 and none on d1", got)
	}
}
