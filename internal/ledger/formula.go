package ledger

import (
	"math"
	"sync/atomic"
)

// The seed's formulas, as pure functions so tests can check them by hand.

// TokenLoad is the token_load prefill score: active + kvWeight·kv. Lower is better.
func TokenLoad(active, kv, kvWeight float64) float64 { return active + kvWeight*kv }

// ClampMatch applies AIBRIX_MIN_MATCH_PCT: a match below the threshold counts as no match.
func ClampMatch(matchPct, minMatchPct float64) float64 {
	if matchPct < minMatchPct || !(matchPct > 0) {
		return 0
	}
	return math.Min(matchPct, 100)
}

// HybridScore is the hybrid_cache_load prefill score. With r = match/100 (after
// ClampMatch) and discount = 1 − r²·factor, it is load·discount when the pod is busy
// (load ≥ 1) and the bare discount when it is idle, so the best match wins between idle
// pods and the load decides between busy ones. A full match at factor 0.5 halves the load;
// a 30 % match discounts by 4.5 %, a 70 % match by 24.5 %.
func HybridScore(load, matchPct, minMatchPct, factor float64) float64 {
	r := ClampMatch(matchPct, minMatchPct) / 100
	discount := 1 - r*r*factor
	if load < 1 {
		return discount
	}
	return load * discount
}

// Rule names what sized a prefill charge's new_tokens.
type Rule string

// The seed's three rules, in the order they are tried.
const (
	RuleSessionDelta Rule = "session_delta" // growth since the session's last prompt
	RulePrefixMatch  Rule = "prefix_match"  // the part of the prompt the pod does not hold
	RuleWholePrompt  Rule = "whole_prompt"
)

// NewTokens is the part of the prompt the prefill pod has to compute, by the first rule
// that applies: the session delta when one was found, the unmatched part when the policy
// looked the prompt up in the prefix cache (matchPct already clamped), else the whole prompt.
func NewTokens(promptTokens int, sessionDelta int, haveDelta, prefixLookup bool, matchPct float64) (float64, Rule) {
	switch {
	case haveDelta:
		return float64(sessionDelta), RuleSessionDelta
	case prefixLookup:
		return float64(promptTokens) * (100 - matchPct) / 100, RulePrefixMatch
	}
	return float64(promptTokens), RuleWholePrompt
}

// atomicFloat is a float64 read without locks. Writers serialise on the ledger's mutex, so
// a plain load-modify-store is enough.
type atomicFloat struct{ bits atomic.Uint64 }

func (f *atomicFloat) Load() float64   { return math.Float64frombits(f.bits.Load()) }
func (f *atomicFloat) Store(v float64) { f.bits.Store(math.Float64bits(v)) }

// add adds d (which may be negative) and clamps the result at zero.
func (f *atomicFloat) add(d float64) float64 {
	v := f.Load() + d
	if v < 0 || math.IsNaN(v) {
		v = 0
	}
	f.Store(v)
	return v
}
