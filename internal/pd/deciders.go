package pd

import (
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// The roleset handler's deciders: each is one of the seed's shortcuts, a plugin its
// handler names under deciders (the handler runs them in the seed's order: overflow, then
// prefill imbalance, then decode imbalance). Each gets the cycle's random source for ties.

// CombinedOverflow is step 0b: whether to send the request to an idle combined pod because
// PD is saturated. It runs only when bucketing is on and a combined pod covers the prompt.
type CombinedOverflow interface {
	picker.Plugin
	Overflow(cy *picker.Cycle, combined []*pool.Endpoint, rolesets []Roleset) bool
}

// PrefillFastPath is step 1: the prefill candidate to send the prefill to at once, or -1.
type PrefillFastPath interface {
	picker.Plugin
	PrefillFastPath(cy *picker.Cycle, knobs *config.PD, pre []PrefillPod) int
}

// DecodeFastPath is step 2: the decode candidate to pick at once and the step that
// decided, or -1. It runs only under decode policies that allow it (DecodePolicy.FastPath).
type DecodeFastPath interface {
	picker.Plugin
	DecodeFastPath(cy *picker.Cycle, b *DecodeBatch) (int, string)
}
