package pd

import (
	"fmt"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
)

// Strategies returns every routing strategy Tandem ships, sharing deps: the PD cascade
// plus random, least-request and prefix-cache, and pd-predictive when the cascade has
// latency models (Options.Models). Hand them to picker.NewRouter.
func Strategies(c *Cascade, deps *picker.Deps, gateway config.PD) []picker.Strategy {
	out := []picker.Strategy{
		c,
		picker.NewRandom(deps),
		picker.NewLeastRequestStrategy(deps),
		picker.NewPrefixCache(deps, gateway),
	}
	if c.models != nil {
		out = append(out, c.NewPredictiveChain())
	}
	return out
}

// StrategyPredictive is the routing-strategy value of the predictive chain.
const StrategyPredictive = config.StrategyPDPredictive

// NewPredictiveChain is the pd-predictive strategy: the roleset handler without the seed's
// count-based shortcuts, pairing on predicted latency, then selective disaggregation and
// the standard pods by predicted cost (slo-overflow-decider mode cost, with the shed):
//
//	prefill:  pd-role-filter(prefill), prompt-length-bucket-filter, prefill-policy-scorer(predicted_ttft)
//	decode:   pd-role-filter(decode), prompt-length-bucket-filter, decode-policy-scorer(predicted_tpot)
//	combined: pd-role-filter(combined), prompt-length-bucket-filter
//	deciders: selective: selective-pd-decider, sloOverflow: slo-overflow-decider
//
// A --config-file declaring the same plugins builds the same chain. It needs the models.
func (c *Cascade) NewPredictiveChain() *picker.Chain {
	h := c.newRolesetHandlerOf("", ProfilePrefill, ProfileDecode, ProfileCombined, c.fallbacks)
	h.placement = []PlacementDecider{
		&SelectiveDecider{picker.NewTypedName(TypeSelectiveDecider, ""), c, defaultTPOTHeadroom},
		&SLOOverflowDecider{picker.NewTypedName(TypeSLOOverflowDecider, ""), c, OverflowCost, defaultTPOTHeadroom, true},
	}
	profiles := []*picker.Profile{
		{Name: ProfilePrefill, Filters: []picker.Filter{NewRoleFilter(RolePrefill), NewBucketFilter()},
			Scorers: []picker.WeightedScorer{{Scorer: c.NewPrefillPolicyScorer(PolicyPredictedTTFT), Weight: 1}}},
		{Name: ProfileDecode, Filters: []picker.Filter{NewRoleFilter(RoleDecode), NewBucketFilter()},
			Scorers: []picker.WeightedScorer{{Scorer: c.NewDecodePolicyScorer(PolicyPredictedTPOT), Weight: 1}}},
		{Name: ProfileCombined, Filters: []picker.Filter{NewRoleFilter(RoleCombined), NewBucketFilter()}},
	}
	ch, err := picker.NewChain(StrategyPredictive, h, profiles, c.deps)
	if err != nil {
		panic(fmt.Sprintf("pd: the predictive chain does not bind: %v", err)) // a programming error
	}
	return ch
}
