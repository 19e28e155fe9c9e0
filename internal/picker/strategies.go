package picker

import "github.com/tandem-epp/tandem/internal/config"

// Strategy names of the non-PD strategies (the PD one lives in internal/pd).
const (
	StrategyRandom       = "random"
	StrategyLeastRequest = "least-request"
	StrategyPrefixCache  = "prefix-cache"
)

// NewRandom is the random strategy: a uniformly random non-prefill endpoint.
func NewRandom(d *Deps) *Chain {
	return single(StrategyRandom, d, nil, &RandomPicker{nameOr("", TypeRandomPicker), DefaultFallbacks})
}

// NewLeastRequestStrategy is the least-request strategy: the non-prefill endpoint with the
// fewest requests in flight, ties at random.
func NewLeastRequestStrategy(d *Deps) *Chain {
	return single(StrategyLeastRequest, d,
		[]WeightedScorer{{&LeastRequestScorer{nameOr("", TypeLeastRequestScorer), d}, 1}},
		&MaxScorePicker{nameOr("", TypeMaxScorePicker), DefaultFallbacks})
}

// NewPrefixCache is the prefix-cache strategy: prefix match (0..1) plus spare capacity
// (1 − inFlight/max), equally weighted, so a full match beats an idle stranger unless its
// holder carries the most load of the pool; the destination warms the index.
func NewPrefixCache(d *Deps, pd config.PD) *Chain {
	ps := &PrefixCacheScorer{named: nameOr("", TypePrefixCacheScorer), deps: d, ProfileMinMatch: true,
		BlockTokens: pd.PrefixCache.BlockSize, MinMatchPct: pd.MinMatchPct}
	c := single(StrategyPrefixCache, d,
		[]WeightedScorer{{ps, 1}, {&LeastRequestScorer{nameOr("", TypeLeastRequestScorer), d}, 1}},
		&MaxScorePicker{nameOr("", TypeMaxScorePicker), DefaultFallbacks})
	c.PostPicks = append(c.PostPicks, ps)
	return c
}

func single(name string, d *Deps, scorers []WeightedScorer, p Picker) *Chain {
	return &Chain{
		StrategyName: name,
		Handler:      NewSingleProfileHandler(),
		Profiles: []*Profile{{
			Name:    name,
			Filters: []Filter{&DecodeRoleFilter{nameOr("", TypeDecodeRoleFilter)}},
			Scorers: scorers,
			Picker:  p,
		}},
		Deps: d,
	}
}
