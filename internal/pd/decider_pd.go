package pd

import (
	"encoding/json"

	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// llm-d's PD deciders, named by a disagg-profile-handler's deciders.prefill.
const (
	TypePrefixBasedPDDecider  = "prefix-based-pd-decider"
	TypeAlwaysDisaggPDDecider = "always-disagg-pd-decider"
)

type prefixDeciderParams struct {
	NonCachedTokens int `json:"nonCachedTokens" default:"0 (never disaggregate)" doc:"Disaggregate when the prompt's part the decode pod does not hold in its prefix cache is at least this many tokens."`
	PromptTokens    int `json:"promptTokens" default:"0 (no minimum)" doc:"Never disaggregate prompts shorter than this many tokens."`
}

// PrefixBasedPDDecider is llm-d's prefix-based-pd-decider: a request is disaggregated when
// its prompt is at least promptTokens long and the part of it the decode pod does not
// already hold (prompt tokens − matched blocks × block size, from the prefix producer) is at
// least nonCachedTokens. nonCachedTokens 0 disables it. Prompt length is Tandem's estimate
// (4 bytes a token).
type PrefixBasedPDDecider struct {
	picker.TypedName
	match                      picker.PrefixMatcher
	nonCachedTokens, minTokens int
}

func newPrefixBasedPDDecider(name string, raw json.RawMessage, h *picker.Handle) (picker.Plugin, error) {
	var p prefixDeciderParams
	if err := picker.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.NonCachedTokens < 0 {
		return nil, picker.BadParam("nonCachedTokens", p.NonCachedTokens, "must be 0 or more")
	}
	if p.PromptTokens < 0 {
		return nil, picker.BadParam("promptTokens", p.PromptTokens, "must be 0 or more")
	}
	m, err := picker.PrefixMatcherFor(h, "", name)
	if err != nil {
		return nil, err
	}
	return &PrefixBasedPDDecider{picker.NewTypedName(TypePrefixBasedPDDecider, name), m, p.NonCachedTokens, p.PromptTokens}, nil
}

// Disaggregate implements PDDecider.
func (d *PrefixBasedPDDecider) Disaggregate(cy *picker.Cycle, e *pool.Endpoint) bool {
	if d.nonCachedTokens == 0 || e == nil {
		return false
	}
	input := cy.Req.PromptTokens
	if d.minTokens > 0 && input < d.minTokens {
		return false
	}
	if input < d.nonCachedTokens {
		return false
	}
	m := d.match.Match(cy)
	return input-m.Blocks(e)*m.BlockTokens >= d.nonCachedTokens
}

// AlwaysDisaggPDDecider is llm-d's always-disagg-pd-decider: every request is disaggregated.
type AlwaysDisaggPDDecider struct{ picker.TypedName }

func newAlwaysDisaggPDDecider(name string, raw json.RawMessage, _ *picker.Handle) (picker.Plugin, error) {
	if err := picker.DecodeParams(raw, nil); err != nil {
		return nil, err
	}
	return &AlwaysDisaggPDDecider{picker.NewTypedName(TypeAlwaysDisaggPDDecider, name)}, nil
}

// Disaggregate implements PDDecider.
func (*AlwaysDisaggPDDecider) Disaggregate(*picker.Cycle, *pool.Endpoint) bool { return true }

var (
	_ PDDecider = (*PrefixBasedPDDecider)(nil)
	_ PDDecider = (*AlwaysDisaggPDDecider)(nil)
)
