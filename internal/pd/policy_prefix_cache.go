package pd

var _ = builtinPrefillPolicy(prefixCachePolicy{})

// prefixCachePolicy: (100 − match%)·0.1 + inFlight/maxInFlight, match below MinMatchPct = 0.
type prefixCachePolicy struct{}

func (prefixCachePolicy) Name() string     { return PolicyPrefixCache }
func (prefixCachePolicy) UsesPrefix() bool { return true }
func (prefixCachePolicy) Score(b *PrefillBatch, i int) float64 {
	p := &b.Pods[i]
	match := p.MatchPct
	if match < b.Knobs.MinMatchPct {
		match = 0
	}
	return (100-match)*0.1 + p.InFlight/b.MaxInFlight
}
