package picker

import (
	"context"
	"encoding/json"

	"github.com/tandem-epp/tandem/internal/prefix"
)

// TypeApproxPrefixCacheProducer is llm-d's prefix producer.
const TypeApproxPrefixCacheProducer = "approx-prefix-cache-producer"

// llm-d v0.10.0's floor on the producer's block size: a smaller configured value is raised
// to it (llm-d-router issue 1158).
const llmdMinBlockTokens = 64

// approxPrefixParams are llm-d's approx-prefix-cache-producer parameters, with its defaults.
type approxPrefixParams struct {
	AutoTune               bool `json:"autoTune" default:"true" doc:"Read the block size from the first candidate's cache_config_info, and each pod's block bound from its GPU blocks, when the engine exports them."`
	BlockSizeTokens        int  `json:"blockSizeTokens" default:"16" doc:"Tokens per prompt block (1 token = 4 bytes of prompt text); raised to 64 as llm-d does."`
	BlockSize              int  `json:"blockSize" default:"0" doc:"Deprecated alias of blockSizeTokens (llm-d)."`
	MaxPrefixBlocksToMatch int  `json:"maxPrefixBlocksToMatch" default:"2048" doc:"Most prompt blocks matched, when maxPrefixTokensToMatch is 0 (0: no cap)."`
	MaxPrefixTokensToMatch int  `json:"maxPrefixTokensToMatch" default:"131072" doc:"Most prompt tokens matched (blocks = tokens / block size); 0 defers to maxPrefixBlocksToMatch."`
	LRUCapacityPerServer   int  `json:"lruCapacityPerServer" default:"31250" doc:"Blocks remembered per pod; its least recently warmed go first. The index as a whole stays within AIBRIX_PREFIX_CACHE_BLOCK_NUMBER."`
}

// ApproxPrefixProducer is llm-d's approx-prefix-cache-producer: before scheduling it
// matches the prompt against its own prefix index (per-pod LRU bound), so that prefix
// scorers and the prefix-based PD decider read each candidate's matched blocks; after the
// pick it warms the index with the destination and the prefill pod.
type ApproxPrefixProducer struct {
	TypedName
	src prefixSource
}

func newApproxPrefixProducer(name string, raw json.RawMessage, h *Handle) (Plugin, error) {
	p := approxPrefixParams{AutoTune: true, BlockSizeTokens: 16, MaxPrefixBlocksToMatch: 2048,
		MaxPrefixTokensToMatch: 131072, LRUCapacityPerServer: 31250}
	if err := DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.BlockSize > 0 && p.BlockSizeTokens == 16 {
		p.BlockSizeTokens = p.BlockSize
	}
	switch {
	case !p.AutoTune && p.BlockSizeTokens <= 0:
		return nil, BadParam("blockSizeTokens", p.BlockSizeTokens, "must be positive when autoTune is false")
	case p.MaxPrefixTokensToMatch < 0:
		return nil, BadParam("maxPrefixTokensToMatch", p.MaxPrefixTokensToMatch, "must be 0 or more")
	case p.MaxPrefixBlocksToMatch < 0:
		return nil, BadParam("maxPrefixBlocksToMatch", p.MaxPrefixBlocksToMatch, "must be 0 or more")
	case p.LRUCapacityPerServer < 0:
		return nil, BadParam("lruCapacityPerServer", p.LRUCapacityPerServer, "must be 0 or more")
	}
	if p.BlockSizeTokens > 0 && p.BlockSizeTokens < llmdMinBlockTokens {
		h.Warn("%s %q: blockSizeTokens=%d is below llm-d's minimum; %d is used, as llm-d does", TypeApproxPrefixCacheProducer, name, p.BlockSizeTokens, llmdMinBlockTokens)
	}
	d := h.Deps
	opts := prefix.Options{MaxBlocksPerHolder: p.LRUCapacityPerServer}
	if d != nil {
		opts.MaxBlocks, opts.Eviction, opts.Clock = d.PrefixCache.MaxBlocks, d.PrefixCache.EvictionDuration, d.Clock
	}
	return &ApproxPrefixProducer{TypedName: NewTypedName(TypeApproxPrefixCacheProducer, name), src: prefixSource{
		deps: d, index: prefix.NewIndex(opts), blockTokens: p.BlockSizeTokens, autoTune: p.AutoTune,
		minBlock: llmdMinBlockTokens, maxBlocks: p.MaxPrefixBlocksToMatch, maxTokens: p.MaxPrefixTokensToMatch,
		capacity: p.LRUCapacityPerServer, key: NewStateKey[*PrefixMatch]("prefix.match/" + name)}}, nil
}

// Produce implements DataProducer: the match is computed here, outside the critical section.
func (p *ApproxPrefixProducer) Produce(_ context.Context, c *Cycle) error {
	p.src.match(c)
	return nil
}

// Match returns the request's match against the producer's index.
func (p *ApproxPrefixProducer) Match(c *Cycle) *PrefixMatch { return p.src.match(c) }

// PostPick implements PostPick: the chosen pods now hold the prompt.
func (p *ApproxPrefixProducer) PostPick(_ context.Context, c *Cycle, d *Decision) { p.src.warm(c, d) }

// PrefixMatcher is what reads a request's prefix match: a producer, or the shared index.
type PrefixMatcher interface {
	Match(c *Cycle) *PrefixMatch
}

// sharedMatcher matches against the shared prefix index with the gateway's block size.
type sharedMatcher struct{ src prefixSource }

func (m *sharedMatcher) Match(c *Cycle) *PrefixMatch { return m.src.match(c) }

// PrefixMatcherFor returns the prefix match a plugin reads: the producer called name when
// given; else the one llm-d reads by default (declared as approx-prefix-cache-producer);
// else the shared index at the gateway's block size. owner names the asking plugin's key.
func PrefixMatcherFor(h *Handle, name, owner string) (PrefixMatcher, error) {
	if name == "" && h.declared[TypeApproxPrefixCacheProducer] {
		name = TypeApproxPrefixCacheProducer
	}
	if name != "" {
		pl, err := h.Require(name)
		if err != nil {
			return nil, err
		}
		pr, ok := pl.(*ApproxPrefixProducer)
		if !ok {
			return nil, errorf("plugin %q is a %s, not an %s", name, pl.Type(), TypeApproxPrefixCacheProducer)
		}
		return pr, nil
	}
	return &sharedMatcher{src: prefixSource{deps: h.Deps, key: NewStateKey[*PrefixMatch]("prefix.match/shared/" + owner)}}, nil
}
