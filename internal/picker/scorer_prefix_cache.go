package picker

import (
	"context"
	"encoding/json"
	"math"

	"github.com/tandem-epp/tandem/internal/pool"
)

// TypePrefixCacheScorer is the prefix scorer of llm-d and GIE (one type name for both).
const TypePrefixCacheScorer = "prefix-cache-scorer"

// prefixCacheParams: llm-d's parameters, GIE's maxPrefixBlocksToMatch, and Tandem's
// blockSize and minMatchPct (for matching against the shared index).
type prefixCacheParams struct {
	PrefixMatchInfoProducerName string   `json:"prefixMatchInfoProducerName" default:"approx-prefix-cache-producer when one is declared" doc:"The producer whose match this scorer reads (llm-d). Without a producer the scorer matches the shared prefix index itself, as GIE's does."`
	MatchLengthWeight           float64  `json:"matchLengthWeight" default:"0" doc:"Weight in [0, 1] of the absolute match length against the match ratio (llm-d)."`
	MatchLengthScaleTokens      int      `json:"matchLengthScaleTokens" default:"8192" doc:"Matched tokens that count as a full-length match (llm-d); must be positive when matchLengthWeight is."`
	MaxPrefixBlocksToMatch      int      `json:"maxPrefixBlocksToMatch" default:"0 (no cap)" doc:"Most prompt blocks matched against the shared index (GIE)."`
	BlockSize                   *int     `json:"blockSize" default:"AIBRIX_PREFIX_CACHE_BLOCK_SIZE" doc:"Tokens per block when matching the shared index (Tandem; GIE's blockSize counts characters)."`
	MinMatchPct                 *float64 `json:"minMatchPct" default:"0" doc:"Matches below this percentage score 0 (Tandem)."`
	AutoTune                    *bool    `json:"autoTune" doc:"GIE's; not accepted here: declare an approx-prefix-cache-producer with autoTune."`
	LRUCapacityPerServer        *int     `json:"lruCapacityPerServer" doc:"GIE's; not accepted here: declare an approx-prefix-cache-producer with lruCapacityPerServer."`
}

// PrefixCacheScorer scores each endpoint by the share of the prompt's leading blocks it
// holds, blended with the absolute match length when matchLengthWeight is set (llm-d's
// formula); matches below MinMatchPct count 0. Without a producer it matches the shared
// prefix index itself and, as a PostPick, warms it with the chosen pods.
type PrefixCacheScorer struct {
	TypedName
	source      PrefixMatcher
	BlockTokens int
	MinMatchPct float64
	// ProfileMinMatch takes the threshold from the request's resolved settings (the gateway's
	// AIBRIX_MIN_MATCH_PCT with the profile's routingConfig.pd.minMatchPct applied) instead of
	// MinMatchPct. The built-in prefix-cache strategy sets it; a --config-file plugin with its
	// own minMatchPct parameter does not.
	ProfileMinMatch bool
	lengthWeight    float64
	lengthScale     int
}

func newPrefixCacheScorer(name string, raw json.RawMessage, h *Handle) (Plugin, error) {
	p := prefixCacheParams{MatchLengthScaleTokens: 8192}
	if err := DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	switch {
	case p.AutoTune != nil:
		return nil, BadParam("autoTune", *p.AutoTune, "is a producer parameter: declare an approx-prefix-cache-producer with it (the scorer reads it through prefixMatchInfoProducerName)")
	case p.LRUCapacityPerServer != nil:
		return nil, BadParam("lruCapacityPerServer", *p.LRUCapacityPerServer, "is a producer parameter: declare an approx-prefix-cache-producer with it (the scorer reads it through prefixMatchInfoProducerName)")
	case p.MatchLengthWeight < 0 || p.MatchLengthWeight > 1:
		return nil, BadParam("matchLengthWeight", p.MatchLengthWeight, "must be in [0, 1]")
	case p.MatchLengthWeight > 0 && p.MatchLengthScaleTokens <= 0:
		return nil, BadParam("matchLengthScaleTokens", p.MatchLengthScaleTokens, "must be positive when matchLengthWeight is")
	case p.BlockSize != nil && *p.BlockSize < 1:
		return nil, BadParam("blockSize", *p.BlockSize, "must be 1 or more")
	case p.MinMatchPct != nil && (*p.MinMatchPct < 0 || *p.MinMatchPct > 100):
		return nil, BadParam("minMatchPct", *p.MinMatchPct, "must be in [0, 100]")
	case p.MaxPrefixBlocksToMatch < 0:
		return nil, BadParam("maxPrefixBlocksToMatch", p.MaxPrefixBlocksToMatch, "must be 0 or more")
	}
	s := &PrefixCacheScorer{TypedName: NewTypedName(TypePrefixCacheScorer, name),
		lengthWeight: p.MatchLengthWeight, lengthScale: p.MatchLengthScaleTokens}
	if p.MinMatchPct != nil {
		s.MinMatchPct = *p.MinMatchPct
	}
	withProducer := p.PrefixMatchInfoProducerName != "" || h.declared[TypeApproxPrefixCacheProducer]
	if withProducer && (p.BlockSize != nil || p.MaxPrefixBlocksToMatch > 0) {
		field := "blockSize"
		if p.BlockSize == nil {
			field = "maxPrefixBlocksToMatch"
		}
		return nil, &ParamError{Field: field, Rule: "applies only without a producer: set it on the approx-prefix-cache-producer this scorer reads"}
	}
	if withProducer {
		src, err := PrefixMatcherFor(h, p.PrefixMatchInfoProducerName, name)
		if err != nil {
			return nil, err
		}
		s.source = src
		return s, nil
	}
	if h.Deps != nil {
		s.BlockTokens = h.Deps.PrefixCache.BlockSize
	}
	if p.BlockSize != nil {
		s.BlockTokens = *p.BlockSize
	}
	s.source = &sharedMatcher{src: prefixSource{deps: h.Deps, blockTokens: s.BlockTokens, maxBlocks: p.MaxPrefixBlocksToMatch,
		key: NewStateKey[*PrefixMatch]("prefix.match/scorer/" + name)}}
	return s, nil
}

// NewPrefixCacheScorer is the scorer over the shared index, with blocks of blockTokens.
func NewPrefixCacheScorer(d *Deps, blockTokens int, minMatchPct float64) *PrefixCacheScorer {
	return &PrefixCacheScorer{TypedName: NewTypedName(TypePrefixCacheScorer, ""), BlockTokens: blockTokens, MinMatchPct: minMatchPct,
		source: &sharedMatcher{src: prefixSource{deps: d, blockTokens: blockTokens, key: NewStateKey[*PrefixMatch]("prefix.match/builtin")}}}
}

// Score implements Scorer.
func (s *PrefixCacheScorer) Score(_ context.Context, c *Cycle, eps []*pool.Endpoint, out []float64) {
	m := s.source.Match(c)
	if m.Total() == 0 {
		return
	}
	minPct := s.MinMatchPct
	if s.ProfileMinMatch {
		minPct = c.Resolved.PD.MinMatchPct
	}
	for i, e := range eps {
		pct := m.Pct(e)
		if pct == 0 || pct < minPct {
			continue
		}
		ratio := pct / 100
		if s.lengthWeight == 0 {
			out[i] = ratio
			continue
		}
		length := math.Min(1, float64(m.Blocks(e)*m.BlockTokens)/float64(s.lengthScale))
		out[i] = s.lengthWeight*length*length + (1-s.lengthWeight)*ratio
	}
}

// PostPick implements PostPick: when the scorer matched the shared index itself, the chosen
// pods now hold the prompt's prefix.
func (s *PrefixCacheScorer) PostPick(_ context.Context, c *Cycle, d *Decision) {
	if sm, ok := s.source.(*sharedMatcher); ok {
		sm.src.warm(c, d)
	}
}
