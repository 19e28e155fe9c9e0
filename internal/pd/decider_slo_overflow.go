package pd

import (
	"encoding/json"
	"fmt"

	"github.com/tandem-epp/tandem/internal/picker"
)

// TypeSLOOverflowDecider is SLO-aware use of the standard pods (and the shed).
const TypeSLOOverflowDecider = "slo-overflow-decider"

// Steps of the standard pods under the predictive chain.
const (
	// StepSLOOverflow: a standard pod took a request PD was predicted to serve too late.
	StepSLOOverflow = "slo_overflow"
	// StepStandardCheaper: a standard pod took a request it was predicted to serve at a
	// lower cost than PD (mode cost).
	StepStandardCheaper = "standard_cheaper"
)

// Modes of slo-overflow-decider.
const (
	OverflowCost = "cost"
	OverflowMiss = "miss"
)

type sloOverflowParams struct {
	Mode         string   `json:"mode" default:"cost" doc:"When a standard pod may take the request: cost — whenever its predicted cost (TTFT/objective + delay to later prompts + TPOT/objective) is below the best PD option's, or the best PD option is predicted to miss the TPOT objective and the standard pod to meet both, and its TPOT stays within tpotHeadroom of the objective (or below the best PD option's when that misses the TPOT objective); among standard pods one predicted to meet both objectives comes first, then the cheapest; miss — only when the best PD option is predicted to miss the TTFT or the TPOT objective and the standard pod to meet both."`
	TPOTHeadroom *float64 `json:"tpotHeadroom" default:"0.8" doc:"Mode cost: the share of the TPOT objective the standard pod's predicted TPOT may reach (0 < x ≤ 1); when the best PD option is predicted to miss the TPOT objective, a standard pod predicted below its TPOT is weighed too."`
	Shed         *bool    `json:"shed" default:"true" doc:"Refuse (429) a sheddable request (a profile with sheddable: true, or an InferenceObjective of negative priority) when no option is predicted to meet its TTFT objective."`
}

// SLOOverflowDecider decides, after the selective decider, whether a standard pod takes
// the request instead of the best PD option (a pair, or a decode pod running the prompt),
// by predicted latency; in mode miss only when PD is predicted to miss the TTFT or the TPOT
// objective (the overflow rule: standard pods mix prefill with decode, so PD is preferred
// while it meets the objectives), in mode cost whenever the standard pod is predicted
// cheaper, or PD misses the TPOT objective and the standard pod meets both (every option's
// TPOT is held to the objective; while PD misses it, tpotHeadroom does not keep out a standard
// pod predicted below PD's TPOT, and one predicted to meet both objectives comes before a
// cheaper one). Either way a standard pod is taken only if its prompt's
// stall fits the slack of the decodes there. When no option meets the TTFT objective and the request is sheddable, it is shed.
type SLOOverflowDecider struct {
	picker.TypedName
	c        *Cascade
	mode     string
	headroom float64
	shed     bool
}

func (c *Cascade) newSLOOverflowDecider(name string, raw json.RawMessage, _ *picker.Handle) (picker.Plugin, error) {
	p := sloOverflowParams{Mode: OverflowCost}
	if err := picker.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.Mode != OverflowCost && p.Mode != OverflowMiss {
		return nil, picker.BadParam("mode", p.Mode, "must be cost or miss")
	}
	h := defaultTPOTHeadroom
	if p.TPOTHeadroom != nil {
		if !(*p.TPOTHeadroom > 0 && *p.TPOTHeadroom <= 1) {
			return nil, picker.BadParam("tpotHeadroom", *p.TPOTHeadroom, "must be above 0 and at most 1")
		}
		h = *p.TPOTHeadroom
	}
	return &SLOOverflowDecider{picker.NewTypedName(TypeSLOOverflowDecider, name), c, p.Mode, h, p.Shed == nil || *p.Shed}, nil
}

// Place implements PlacementDecider.
func (d *SLOOverflowDecider) Place(p *Placement) bool {
	if d.c.models == nil {
		return false
	}
	o := p.Objective
	pr := predictor{d.c.models}
	miss := p.Best.TTFT > o.TTFT || p.Best.TPOT > o.TPOT
	var best Option
	if d.mode == OverflowCost || miss {
		for _, e := range p.Combined {
			if d.mode == OverflowCost {
				opt := pr.wholeOption(o, p.PromptTokens, e, nil, p.Match[e.Key()], StepStandardCheaper)
				if !weighs(opt.TPOT, p.Best, o, d.headroom) || !replaces(opt.Cost, opt.TTFT, opt.TPOT, p.Best, o) || (best.Destination != nil && !betterStandard(opt, best, o)) || !pr.stallFits(opt) {
					continue
				}
				best = opt
				continue
			}
			opt := pr.wholeOption(o, p.PromptTokens, e, nil, p.Match[e.Key()], StepSLOOverflow)
			if !meetsBoth(opt, o) || (best.Destination != nil && !(opt.TTFT < best.TTFT)) || !pr.stallFits(opt) {
				continue
			}
			best = opt
		}
	}
	changed := false
	if best.Destination != nil {
		p.Notes = append(p.Notes, fmt.Sprintf("%s %s: ttft %.0f ms, cost %.3f (best PD: ttft %.0f ms, cost %.3f)",
			best.Step, best.Destination.Key(), best.TTFT*1000, best.Cost, p.Best.TTFT*1000, p.Best.Cost))
		p.Best, changed = best, true
	}
	if d.shed && o.Sheddable && o.HasTTFT && p.Best.TTFT > o.TTFT {
		p.Notes = append(p.Notes, fmt.Sprintf("shed: best predicted ttft %.0f ms > objective %.0f ms", p.Best.TTFT*1000, o.TTFT*1000))
		p.Shed = true
		return true
	}
	return changed
}

// betterStandard reports whether standard pod option a beats b (mode cost): one predicted to
// meet both objectives beats one that is not; between equals the cheaper wins.
func betterStandard(a, b Option, o Objective) bool {
	if ma, mb := meetsBoth(a, o), meetsBoth(b, o); ma != mb {
		return ma
	}
	return a.Cost < b.Cost
}

var _ PlacementDecider = (*SLOOverflowDecider)(nil)
