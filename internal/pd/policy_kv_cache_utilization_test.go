package pd

import (
	"math"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/metrics"
)

// kv_cache_utilization, worked by hand: 100 − FreeGPU + requests / the batch's most.
func TestKVCacheUtilizationScores(t *testing.T) {
	cases := []struct {
		name  string
		pod   DecodePod
		maxRq float64
		want  float64
	}{
		{"idle, nothing scraped (FreeGPU 100)", DecodePod{FreeGPU: 100}, 1, 0},
		{"30 % used, 2 of the batch's 4 requests", DecodePod{FreeGPU: 70, Running: 1, Pending: 1}, 4, 30.5},
		{"30 % used, the batch's most requests", DecodePod{FreeGPU: 70, Running: 4}, 4, 31},
		{"full (FreeGPU floored at 0.1), idle", DecodePod{FreeGPU: 0.1}, 3, 99.9},
		{"pending decodes count as requests", DecodePod{FreeGPU: 90, Pending: 3}, 6, 10.5},
	}
	for _, tc := range cases {
		b := &DecodeBatch{Pods: []DecodePod{tc.pod}, MaxRequests: tc.maxRq}
		if got := (kvCacheUtilizationDecode{}).Score(b, 0); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %.4f, want %.4f", tc.name, got, tc.want)
		}
	}
	// Load breaks a tie in utilisation, never outweighs a percentage point of it.
	b := &DecodeBatch{Pods: []DecodePod{{FreeGPU: 60, Running: 9}, {FreeGPU: 60, Running: 1}, {FreeGPU: 61, Running: 10}}, MaxRequests: 10}
	p := kvCacheUtilizationDecode{}
	if a, c := p.Score(b, 0), p.Score(b, 1); !(c < a) {
		t.Errorf("equal utilisation: the pod with fewer requests should score lower (%.2f vs %.2f)", c, a)
	}
	if a, c := p.Score(b, 2), p.Score(b, 1); !(a < c) {
		t.Errorf("one point less utilised should win whatever its load (%.2f vs %.2f)", a, c)
	}
}

// Named in AIBRIX_DECODE_SCORE_POLICY, the policy decides the pair's decode pod: the less
// used KV cache wins whichever roleset holds it.
func TestKVCacheUtilizationPicksTheFreerDecodePod(t *testing.T) {
	for _, tc := range []struct {
		usageA, usageB float64
		want           string
	}{{0.8, 0.2, "dB"}, {0.2, 0.8, "dA"}} {
		h := newHarness(t, gateway(func(g *config.PD) {
			g.PrefillScorePolicy = PolicyLeastRequest
			g.DecodeScorePolicy = PolicyKVCacheUtilization
		}), twoRolesets()...)
		h.sample("dA", metrics.Sample{KVUsage: tc.usageA, HasKVUsage: true})
		h.sample("dB", metrics.Sample{KVUsage: tc.usageB, HasKVUsage: true})
		if d := h.mustPick(prompt("x", 8)); first(d.Destination) != tc.want {
			t.Errorf("KV usage dA %.1f, dB %.1f: dest %s, want %s (%+v)", tc.usageA, tc.usageB, first(d.Destination), tc.want, d.Trace)
		}
	}
}
