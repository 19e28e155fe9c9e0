package pd

import (
	"strings"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
)

// RegisterPlugins adds the PD plugin types to reg: llm-d's disaggregation handler and
// deciders, and the seed's cascade as plugins (the roleset handler, its deciders, filters and
// policy scorers). Every one shares c's trackers, policies and critical section, so a chain a
// config file composes sees the same load as the built-in pd strategy. c may be nil for a
// registry that only answers Has (a config file's type check).
func RegisterPlugins(reg *picker.Registry, c *Cascade) {
	for _, r := range c.registrations() {
		reg.Register(r)
	}
}

// NewRegistry is a registry holding every plugin type of this build, over c.
func NewRegistry(c *Cascade) *picker.Registry {
	reg := picker.NewRegistry()
	RegisterPlugins(reg, c)
	return reg
}

// IsPluginType reports whether typ is a registered plugin type of this build.
func IsPluginType(typ string) bool { return NewRegistry(nil).Has(typ) }

func (c *Cascade) registrations() []picker.Registration {
	names := config.DefaultNames()
	return []picker.Registration{
		{Type: TypeDisaggHandler, Kind: picker.KindProfileHandler, Origin: picker.OriginLLMD, Params: disaggParams{}, New: c.newDisaggHandler,
			Doc: "llm-d's P/D handler: the decode profile picks the destination; when the prefill decider says so, the prefill profile picks the prefill target (x-prefiller-host-port). Also accepts llm-d's deprecated flat parameters."},
		{Type: TypePrefixBasedPDDecider, Kind: picker.KindDecider, Origin: picker.OriginLLMD, Params: prefixDeciderParams{}, New: newPrefixBasedPDDecider,
			Doc: "Disaggregates when the prompt part the decode pod does not hold in its prefix cache is at least nonCachedTokens (matches from the approx-prefix-cache-producer, else the shared index)."},
		{Type: TypeAlwaysDisaggPDDecider, Kind: picker.KindDecider, Origin: picker.OriginLLMD, New: newAlwaysDisaggPDDecider,
			Doc: "Disaggregates every request."},
		{Type: TypeRolesetHandler, Kind: picker.KindProfileHandler, Origin: picker.OriginTandem, Params: rolesetHandlerParams{}, New: c.newRolesetHandler,
			Doc: "The seed's Pod Selection Algorithm: a prefill/decode pair from one roleset (or a combined pod), with its fast paths as deciders; the built-in pd strategy is this handler over the default profiles."},
		{Type: TypeCombinedOverflowDecider, Kind: picker.KindDecider, Origin: picker.OriginTandem, New: c.newCombinedOverflowDecider,
			Doc: "Step 0b: with bucketing, an idle combined pod (queue-drain score < 0.25) takes the request when a PD pod is saturated (> 1.0)."},
		{Type: TypePrefillImbalanceDecider, Kind: picker.KindDecider, Origin: picker.OriginTandem, Params: prefillImbalanceParams{}, New: newPrefillImbalanceDecider,
			Doc: "Step 1: when the in-flight prefill spread exceeds minSpread, the least-loaded prefill pod, and decode from its roleset."},
		{Type: TypeDecodeImbalanceDecider, Kind: picker.KindDecider, Origin: picker.OriginTandem, New: newDecodeImbalanceDecider,
			Doc: "Step 2: the decode pod with the fewest requests, the lowest throughput or the lowest drain ratio when that spread is wide (AIBRIX_DECODE_* thresholds)."},
		{Type: TypeSelectiveDecider, Kind: picker.KindDecider, Origin: picker.OriginTandem, Params: selectiveParams{}, New: c.newSelectiveDecider,
			Doc: "Selective disaggregation by predicted latency (the roleset handler's deciders.selective): the prompt runs whole on a decode pod when predicted TTFT/objective + TPOT/objective there is below the pair's, or the pair's decode pod is predicted to miss the TPOT objective and the prompt is predicted to meet both there, and the pod's predicted TPOT stays within tpotHeadroom of the objective (or, while the pair misses it, below the pair's)."},
		{Type: TypeSLOOverflowDecider, Kind: picker.KindDecider, Origin: picker.OriginTandem, Params: sloOverflowParams{}, New: c.newSLOOverflowDecider,
			Doc: "The standard pods by predicted latency (deciders.sloOverflow): mode cost — a standard pod takes the request when predicted cheaper than PD, or when PD is predicted to miss the TPOT objective and the standard pod to meet both; mode miss — only when PD is predicted to miss the TTFT or the TPOT objective and the standard pod to meet both. Sheds (429) a sheddable request nothing can serve in time."},
		{Type: TypeRoleFilter, Kind: picker.KindFilter, Origin: picker.OriginTandem, Params: roleFilterParams{}, New: newRoleFilter,
			Doc: "Keeps the pods of one role as the seed reads it: role-name, else llm-d.ai/role (prefill, decode), or combined pods."},
		{Type: TypeBucketFilter, Kind: picker.KindFilter, Origin: picker.OriginTandem, New: newBucketFilter,
			Doc: "Step 0: with prompt-length bucketing on for the request, keeps the pods whose declared range covers the prompt."},
		{Type: TypeStddevFilter, Kind: picker.KindFilter, Origin: picker.OriginTandem, Params: stddevParams{}, New: c.newStddevFilter,
			Doc: "Step 3's skip: drops prefill pods with more requests in flight than mean + factor × std (lifted by the roleset handler when it leaves no pair)."},
		{Type: TypePrefillPolicyScorer, Kind: picker.KindScorer, Origin: picker.OriginTandem, Params: prefillPolicyParams{}, New: c.newPolicyScorer(true),
			Doc: "A prefill score policy (" + strings.Join(names.PrefillPolicies, ", ") + ") as a scorer: 1 − cost / max(1, costs)."},
		{Type: TypeDecodePolicyScorer, Kind: picker.KindScorer, Origin: picker.OriginTandem, Params: decodePolicyParams{}, New: c.newPolicyScorer(false),
			Doc: "A decode score policy (" + strings.Join(names.DecodePolicies, ", ") + ") as a scorer: 1 − cost / max(0.01, costs), with the seed's cold-start score where the policy takes it."},
	}
}
