package pd

import (
	"encoding/json"
	"math"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
)

// TypePrefillImbalanceDecider is step 1 of the seed.
const TypePrefillImbalanceDecider = "prefill-imbalance-decider"

type prefillImbalanceParams struct {
	MinSpread *float64 `json:"minSpread" default:"AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD (16)" doc:"In-flight prefill spread (max − min) above which (strictly) the least-loaded prefill pod is chosen; unset follows the request's profile."`
}

// PrefillImbalanceDecider is step 1: when the in-flight prefill spread max − min exceeds
// minSpread (strict), the least-loaded prefill pod, at random among equals.
type PrefillImbalanceDecider struct {
	picker.TypedName
	minSpread *float64
}

func newPrefillImbalanceDecider(name string, raw json.RawMessage, _ *picker.Handle) (picker.Plugin, error) {
	var p prefillImbalanceParams
	if err := picker.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.MinSpread != nil && !(*p.MinSpread >= 0) {
		return nil, picker.BadParam("minSpread", *p.MinSpread, "must be 0 or more")
	}
	return &PrefillImbalanceDecider{picker.NewTypedName(TypePrefillImbalanceDecider, name), p.MinSpread}, nil
}

// PrefillFastPath implements PrefillFastPath.
func (d *PrefillImbalanceDecider) PrefillFastPath(cy *picker.Cycle, knobs *config.PD, pre []PrefillPod) int {
	spread := knobs.PrefillLoadImbalanceMinSpread
	if d.minSpread != nil {
		spread = *d.minSpread
	}
	if len(pre) < 2 {
		return -1
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range pre {
		lo, hi = math.Min(lo, p.InFlight), math.Max(hi, p.InFlight)
	}
	if !(hi-lo > spread) {
		return -1
	}
	pick, seen := -1, 0
	for i, p := range pre {
		if p.InFlight == lo {
			seen++
			if cy.RandN(seen) == 0 {
				pick = i
			}
		}
	}
	return pick
}
