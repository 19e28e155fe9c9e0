package pd

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/metrics"
)

// The seed's formulas, worked by hand.
func TestPrefillPolicyFormulas(t *testing.T) {
	k := config.DefaultPD()
	k40 := k
	k40.MinMatchPct = 40
	cases := []struct {
		name   string
		pol    PrefillPolicy
		knobs  *config.PD
		pod    PrefillPod
		maxIn  float64
		tokens int
		want   float64
	}{
		// (100 − match)·0.1 + inFlight/maxInFlight
		{"prefix_cache 50% match, 2 of max 4", prefixCachePolicy{}, &k, PrefillPod{MatchPct: 50, InFlight: 2}, 4, 0, 5.5},
		{"prefix_cache no match, idle", prefixCachePolicy{}, &k, PrefillPod{}, 1, 0, 10},
		{"prefix_cache full match, 4 of 4", prefixCachePolicy{}, &k, PrefillPod{MatchPct: 100, InFlight: 4}, 4, 0, 1},
		{"prefix_cache 30% under min-match 40 counts 0", prefixCachePolicy{}, &k40, PrefillPod{MatchPct: 30, InFlight: 1}, 2, 0, 10.5},
		{"prefix_cache 40% at min-match 40 counts", prefixCachePolicy{}, &k40, PrefillPod{MatchPct: 40, InFlight: 1}, 2, 0, 6.5},
		{"least_request", leastRequestPrefill{}, &k, PrefillPod{InFlight: 7, MatchPct: 100}, 9, 0, 7},
		// 1000 tokens, 50% matched, 1 in flight, no prefill-time histogram:
		// queue = 1·(0.001·512^1.5 + 5) = 16.5852; prefix = 0.005·500 + 1 = 3.5;
		// prefill = 0.001·500^1.5 + 5 = 16.1803; total 36.2656.
		{"conductor default queue time", conductorPrefill{}, &k, PrefillPod{MatchPct: 50, InFlight: 1}, 1, 1000, 36.2656},
		// with a 20 ms mean prefill time: queue = 2·20 = 40; no match: prefix 0, prefill = 0.001·1000^1.5 + 5 = 36.6228.
		{"conductor with prefill histogram", conductorPrefill{}, &k,
			PrefillPod{InFlight: 2, Sample: &metrics.Sample{PrefillTimeMean: 0.020, HasPrefillTimeMean: true}}, 2, 1000, 76.6228},
		{"conductor full match, idle: prefix only", conductorPrefill{}, &k, PrefillPod{MatchPct: 100}, 1, 1000, 6},
	}
	for _, tc := range cases {
		b := &PrefillBatch{Pods: []PrefillPod{tc.pod}, MaxInFlight: tc.maxIn, PromptTokens: tc.tokens, Knobs: tc.knobs}
		if got := tc.pol.Score(b, 0); math.Abs(got-tc.want) > 1e-4 {
			t.Errorf("%s: %.4f, want %.4f", tc.name, got, tc.want)
		}
	}
}

// conductor counts what AIBrix's does: its tokenizer's output (a 4000-byte prompt is 4000 with
// the default character tokenizer), not the 1000-token estimate. A pod with half of it cached
// and 2 prefills in flight beats an idle pod without it, as in AIBrix:
// busy = 2·16.5852 + (0.005·2000 + 1) + (0.001·2000^1.5 + 5) = 138.6132;
// idle = 0.001·4000^1.5 + 5 = 257.9822. Counted as 1000 tokens the idle pod would win
// (52.8509 against 36.6228).
func TestConductorCountsTheTokenizersOutput(t *testing.T) {
	k := config.DefaultPD()
	b := &PrefillBatch{Pods: []PrefillPod{{MatchPct: 50, InFlight: 2}, {}}, MaxInFlight: 2, PromptTokens: 1000, TokenizedLen: 4000, Knobs: &k}
	busy, idle := conductorPrefill{}.Score(b, 0), conductorPrefill{}.Score(b, 1)
	if math.Abs(busy-138.6132) > 1e-3 || math.Abs(idle-257.9822) > 1e-3 || !(busy < idle) {
		t.Errorf("busy %.4f, idle %.4f; want 138.6132 < 257.9822", busy, idle)
	}
}

func TestDecodePolicyFormulas(t *testing.T) {
	k := config.DefaultPD()
	k2 := k
	k2.DecodeLBWeightRunning = 2
	k0 := k
	k0.DecodeLBWeightThroughput = 0
	cases := []struct {
		name  string
		pol   DecodePolicy
		knobs *config.PD
		pod   DecodePod
		want  float64
	}{
		// (w_run·req/maxReq + w_thru·(1 − thr/maxThr)) / (free/maxFree), maxima 8, 1000, 100.
		{"load_balancing", loadBalancingPolicy{}, &k, DecodePod{Running: 3, Pending: 1, Throughput: 500, FreeGPU: 50}, 2},
		{"load_balancing w_run 2", loadBalancingPolicy{}, &k2, DecodePod{Running: 4, Throughput: 500, FreeGPU: 50}, 3},
		{"load_balancing w_thru 0", loadBalancingPolicy{}, &k0, DecodePod{Running: 4, Throughput: 500, FreeGPU: 50}, 1},
		{"load_balancing full KV (free 0.1)", loadBalancingPolicy{}, &k, DecodePod{Running: 8, Throughput: 1000, FreeGPU: 0.1}, 1000},
		{"least_request running + pending", leastRequestDecode{}, &k, DecodePod{Running: 3, Pending: 2}, 5},
		// tbt = 1000/50 = 20 ms; ·(1 + 1/4) = 25; KV 95% > 90% → ·1.5 = 37.5
		{"conductor under KV pressure", conductorDecode{}, &k, DecodePod{Running: 4, Throughput: 50, FreeGPU: 5}, 37.5},
		// no throughput: 20 ms; requests 0 → max(0, 1) = 1 → ·2 = 40
		{"conductor cold", conductorDecode{}, &k, DecodePod{FreeGPU: 100}, 40},
		{"conductor at exactly 90% KV: no penalty", conductorDecode{}, &k, DecodePod{Running: 1, Throughput: 100, FreeGPU: 10}, 20},
	}
	for _, tc := range cases {
		b := &DecodeBatch{Pods: []DecodePod{tc.pod}, MaxRequests: 8, MaxThroughput: 1000, MaxFreeGPU: 100, Knobs: tc.knobs}
		if got := tc.pol.Score(b, 0); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A policy registered by name is usable at once (how token_load will plug in).
type constDecode struct{}

func (constDecode) Name() string                    { return "const" }
func (constDecode) ColdStart() bool                 { return false }
func (constDecode) FastPath() bool                  { return false }
func (constDecode) Score(*DecodeBatch, int) float64 { return 1 }

func TestPolicyRegistry(t *testing.T) {
	p := NewPolicies()
	gw := config.DefaultPD()
	if _, _, _, err := p.resolve("", &gw, &config.RoutingConfig{DecodeScorePolicy: "const"}); err == nil {
		t.Fatal("unregistered decode policy resolved")
	}
	p.RegisterDecode(constDecode{})
	_, dec, _, err := p.resolve("", &gw, &config.RoutingConfig{DecodeScorePolicy: "const"})
	if err != nil || dec.Name() != "const" {
		t.Fatalf("%v %v", dec, err)
	}
	pre, dec2 := p.Names()
	if len(pre) != len(builtinPrefill) || len(dec2) != len(builtinDecode)+1 || !slices.Contains(dec2, "const") {
		t.Fatalf("names %v %v", pre, dec2)
	}
	// Unregistered prefill names fall through to the gateway's, then to prefix_cache.
	bad := gw
	bad.PrefillScorePolicy = "gone"
	pol, _, note, err := p.resolve(PolicyLeastRequest, &bad, &config.RoutingConfig{PrefillScorePolicy: "token_load"})
	if err != nil || pol.Name() != PolicyLeastRequest || !strings.Contains(note, `"token_load"`) || !strings.Contains(note, `"gone"`) {
		t.Fatalf("fallback to the gateway policy: %v %q %v", pol, note, err)
	}
	pol, _, _, _ = p.resolve("gone too", &bad, &config.RoutingConfig{})
	if pol.Name() != PolicyPrefixCache {
		t.Fatalf("last resort: %v", pol)
	}
}
