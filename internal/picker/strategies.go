package picker

import "github.com/tandem-epp/tandem/internal/config"

// Strategy names of the non-PD strategies (the PD one lives in internal/pd).
const (
	StrategyRandom       = config.StrategyRandom
	StrategyLeastRequest = config.StrategyLeastRequest
	StrategyPrefixCache  = config.StrategyPrefixCache
)

// NewRandom is the random strategy: a uniformly random non-prefill endpoint.
func NewRandom(d *Deps) *Chain {
	return single(StrategyRandom, d, nil, NewRandomPicker())
}

// NewLeastRequestStrategy is the least-request strategy: the non-prefill endpoint with the
// fewest requests in flight, ties at random.
func NewLeastRequestStrategy(d *Deps) *Chain {
	return single(StrategyLeastRequest, d, []WeightedScorer{{NewLeastRequestScorer(d), 1}}, NewMaxScorePicker())
}

// NewPrefixCache is the prefix-cache strategy: prefix match (0..1) plus spare capacity
// (1 − inFlight/max), equally weighted, so a full match beats an idle stranger unless its
// holder carries the most load of the pool; the destination warms the index.
func NewPrefixCache(d *Deps, pd config.PD) *Chain {
	ps := NewPrefixCacheScorer(d, pd.PrefixCache.BlockSize, pd.MinMatchPct)
	ps.ProfileMinMatch = true
	return single(StrategyPrefixCache, d, []WeightedScorer{{ps, 1}, {NewLeastRequestScorer(d), 1}}, NewMaxScorePicker())
}

// single is a one-profile strategy behind the decode-role filter.
func single(name string, d *Deps, scorers []WeightedScorer, p Picker) *Chain {
	prof := &Profile{Name: name, Filters: []Filter{NewDecodeRoleFilter()}, Scorers: scorers, Picker: p}
	c, err := NewChain(name, NewSingleProfileHandler(), []*Profile{prof}, d)
	if err != nil {
		panic(err) // a single-profile handler binds nothing
	}
	return c
}
