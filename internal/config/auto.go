package config

import (
	"slices"
	"strings"

	"github.com/tandem-epp/tandem/internal/tokenize"
)

// AutoProfile is the config-profile value that asks for the profile whose routingConfig hints
// (promptTokensGte, promptTokensLt, maxTokensGte, maxTokensLt) match the request. It is matched
// in any case, as AIBrix does.
const AutoProfile = "auto"

// Features are what config-profile: auto reads of a request.
type Features struct {
	// Prompt is the prompt's length in tokens, counted only as far as the hints need; nil
	// when unknown (prompt hints then match nothing, as in AIBrix when tokenizing fails).
	Prompt *tokenize.Length
	// MaxTokens is max_tokens, else max_completion_tokens, when the request has one.
	MaxTokens    int64
	HasMaxTokens bool
}

// autoCandidate is a profile with at least one hint, in name order.
type autoCandidate struct {
	name string
	rc   RoutingConfig
}

func hints(rc *RoutingConfig) []*int64 {
	return []*int64{rc.PromptTokensGte, rc.PromptTokensLt, rc.MaxTokensGte, rc.MaxTokensLt}
}

func hintCount(rc *RoutingConfig) int {
	n := 0
	for _, h := range hints(rc) {
		if h != nil {
			n++
		}
	}
	return n
}

// autoCandidates lists the profiles config-profile: auto chooses among, by name, and the
// prompt-token boundaries their hints compare with.
func autoCandidates(cfg ModelConfig) (out []autoCandidate, bounds []int) {
	for _, name := range sortedKeys(cfg.Profiles) {
		rc := cfg.Profiles[name].RoutingConfig
		if rc == nil || hintCount(rc) == 0 {
			continue
		}
		out = append(out, autoCandidate{name, *rc})
		for _, h := range []*int64{rc.PromptTokensGte, rc.PromptTokensLt} {
			if h != nil && *h > 0 && *h <= int64(^uint32(0)>>1) {
				bounds = append(bounds, int(*h))
			}
		}
	}
	slices.Sort(bounds)
	return out, slices.Compact(bounds)
}

func (c *autoCandidate) matches(prompt int, hasPrompt bool, f Features) bool {
	rc := &c.rc
	if rc.PromptTokensGte != nil || rc.PromptTokensLt != nil {
		if !hasPrompt {
			return false
		}
		if rc.PromptTokensGte != nil && int64(prompt) < *rc.PromptTokensGte {
			return false
		}
		if rc.PromptTokensLt != nil && int64(prompt) >= *rc.PromptTokensLt {
			return false
		}
	}
	if rc.MaxTokensGte != nil && (!f.HasMaxTokens || f.MaxTokens < *rc.MaxTokensGte) {
		return false
	}
	if rc.MaxTokensLt != nil && (!f.HasMaxTokens || f.MaxTokens >= *rc.MaxTokensLt) {
		return false
	}
	return true
}

// moreSpecific orders matching candidates as AIBrix does: more hints first, then the higher
// lower bound and the lower upper bound, prompt before max tokens. An unset lower bound counts
// as 0, an unset upper bound as unlimited.
func (c *autoCandidate) moreSpecific(o *autoCandidate) bool {
	if a, b := hintCount(&c.rc), hintCount(&o.rc); a != b {
		return a > b
	}
	lower := func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	}
	upper := func(p *int64) int64 {
		if p == nil {
			return int64(^uint64(0) >> 1)
		}
		return *p
	}
	switch {
	case lower(c.rc.PromptTokensGte) != lower(o.rc.PromptTokensGte):
		return lower(c.rc.PromptTokensGte) > lower(o.rc.PromptTokensGte)
	case upper(c.rc.PromptTokensLt) != upper(o.rc.PromptTokensLt):
		return upper(c.rc.PromptTokensLt) < upper(o.rc.PromptTokensLt)
	case lower(c.rc.MaxTokensGte) != lower(o.rc.MaxTokensGte):
		return lower(c.rc.MaxTokensGte) > lower(o.rc.MaxTokensGte)
	}
	return upper(c.rc.MaxTokensLt) < upper(o.rc.MaxTokensLt)
}

// autoProfile resolves config-profile: auto: the most specific profile whose hints match, the
// first by name among equals, else the default profile. The prompt is counted only when a
// prompt hint's boundary is near its estimate (and no further than the largest one).
func (v *modelView) autoProfile(f Features) string {
	prompt, hasPrompt := 0, f.Prompt != nil
	if hasPrompt && len(v.autoBounds) > 0 {
		p := f.Prompt.Probe()
		for _, b := range v.autoBounds {
			p.Boundary(b)
		}
		prompt, _ = p.Tokens()
	}
	best := -1
	for i := range v.auto {
		if v.auto[i].matches(prompt, hasPrompt, f) && (best < 0 || v.auto[i].moreSpecific(&v.auto[best])) {
			best = i
		}
	}
	if best < 0 {
		return v.defaultName
	}
	return v.auto[best].name
}

func isAuto(profile string) bool { return strings.EqualFold(strings.TrimSpace(profile), AutoProfile) }
