package picker

import (
	"context"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
	"github.com/tandem-epp/tandem/internal/request"
)

// The prefix-cache strategy applies the request's resolved minimum match (the gateway's
// AIBRIX_MIN_MATCH_PCT with the profile's routingConfig.pd.minMatchPct applied).
func TestPrefixCacheStrategyUsesTheProfileMinMatch(t *testing.T) {
	gw := config.DefaultPD()
	gw.PrefixCache.BlockSize = 4 // 16 bytes a block
	deps := NewDeps(nil, gw.PrefixCache)
	chain := NewPrefixCache(deps, gw)
	ps := chain.PostPicks[0].(*PrefixCacheScorer)

	e := pool.NewEndpoint("ns", "a", "10.0.0.1", 8000, 0, nil, nil)
	// The endpoint holds the first 2 of the prompt's 4 blocks: a 50 % match.
	prompt := strings.Repeat("x", 64)
	hashes := prefix.Hash(nil, prompt, prefix.BlockBytes(4))
	if len(hashes) != 4 {
		t.Fatalf("%d blocks, want 4", len(hashes))
	}
	deps.Prefix.Add("m", hashes[:2], e.Key())

	for _, tc := range []struct {
		minMatch float64
		want     float64
	}{
		{0, 0.5},  // no threshold: the 50 % match scores 0.5
		{50, 0.5}, // at the threshold: kept
		{60, 0},   // a profile raising the threshold to 60 % ignores the match
	} {
		pd := gw
		pd.MinMatchPct = tc.minMatch
		c := &Cycle{Req: &request.Request{Model: "m", Prompt: prompt}, Resolved: Resolved{PD: pd}, State: &CycleState{}}
		out := make([]float64, 1)
		ps.Score(context.Background(), c, []*pool.Endpoint{e}, out)
		if out[0] != tc.want {
			t.Errorf("minMatchPct %v: score %v, want %v", tc.minMatch, out[0], tc.want)
		}
	}
}
