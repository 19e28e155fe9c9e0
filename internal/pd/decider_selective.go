package pd

import (
	"encoding/json"
	"fmt"

	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/picker"
)

// TypeSelectiveDecider is selective disaggregation by predicted latency.
const TypeSelectiveDecider = "selective-pd-decider"

// StepDecodeLocal: a decode pod runs the whole request (its prompt too).
const StepDecodeLocal = "decode_local"

// Default of selective-pd-decider's tpotHeadroom.
const defaultTPOTHeadroom = 0.8

type selectiveParams struct {
	TPOTHeadroom *float64 `json:"tpotHeadroom" default:"0.8" doc:"A decode pod may run a prompt itself only while the TPOT predicted there, for its running decodes and this request, stays at most this share of the request's TPOT objective (0 < x ≤ 1), or, when the pair is predicted to miss the TPOT objective, below the pair's TPOT."`
}

// SelectiveDecider is selective disaggregation: a prompt runs whole on a decode pod when
// the pod's predicted TPOT stays within tpotHeadroom of the objective (or below the pair's
// when the pair is predicted to miss the TPOT objective) and that is predicted
// to cost less than the pair — predicted TTFT ÷ the TTFT objective + predicted TPOT ÷ the
// TPOT objective, where the pod's TPOT counts the prefill load the prompt adds to every
// decode there — or, when the pair's decode pod is predicted to miss the TPOT objective
// (every option's TPOT is held to it), to meet both objectives, even at a higher cost. A
// short or mostly cached prompt, whose prefill costs the pod's decodes little and spares the
// KV hand-over, runs locally; a long one, or any prompt while the decode pods' TPOT is near
// its objective, is disaggregated. (llm-d's prefix-based-pd-decider decides the same on a
// fixed uncached-token threshold.)
type SelectiveDecider struct {
	picker.TypedName
	c        *Cascade
	headroom float64
}

func (c *Cascade) newSelectiveDecider(name string, raw json.RawMessage, _ *picker.Handle) (picker.Plugin, error) {
	var p selectiveParams
	if err := picker.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	h := defaultTPOTHeadroom
	if p.TPOTHeadroom != nil {
		if !(*p.TPOTHeadroom > 0 && *p.TPOTHeadroom <= 1) {
			return nil, picker.BadParam("tpotHeadroom", *p.TPOTHeadroom, "must be above 0 and at most 1")
		}
		h = *p.TPOTHeadroom
	}
	return &SelectiveDecider{picker.NewTypedName(TypeSelectiveDecider, name), c, h}, nil
}

// Place implements PlacementDecider.
func (d *SelectiveDecider) Place(p *Placement) bool {
	if d.c.models == nil {
		return false
	}
	pr := predictor{d.c.models}
	best := p.Best
	for i, e := range p.Decode {
		var f *latency.Forecast
		if p.DecodeForecasts != nil {
			f = &p.DecodeForecasts[i]
			if !f.Valid() {
				*f = d.c.models.ForecastOf(e)
			}
		}
		f = pr.read(e, f)
		pct := p.Match[e.Key()]
		w := predictWhole(p.Objective, p.PromptTokens, f, pct)
		if !weighs(w.tpot, best, p.Objective, d.headroom) || stalls(f, w.svc) || !replaces(w.cost, w.ttft, w.tpot, best, p.Objective) {
			continue
		}
		best = pr.wholeOption(p.Objective, p.PromptTokens, e, f, pct, StepDecodeLocal)
	}
	if best.Destination == p.Best.Destination && best.Kind == p.Best.Kind {
		return false
	}
	p.Notes = append(p.Notes, fmt.Sprintf("decode_local %s: cost %.3f, tpot %.1f ms (pair: cost %.3f, tpot %.1f ms)",
		best.Destination.Key(), best.Cost, best.TPOT*1000, p.Best.Cost, p.Best.TPOT*1000))
	p.Best = best
	return true
}

var _ PlacementDecider = (*SelectiveDecider)(nil)
