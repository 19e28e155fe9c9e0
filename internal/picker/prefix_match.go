package picker

import (
	"strconv"
	"sync"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
	"github.com/tandem-epp/tandem/internal/tokenize"
)

// PrefixMatch is one request's prompt matched against a prefix index: how many leading
// prompt blocks each endpoint holds (llm-d's PrefixCacheMatchInfo, for every endpoint at once).
type PrefixMatch struct {
	Model       string
	BlockTokens int
	// Hashes are the prompt blocks that were matched (after any cap), the ones a warm adds.
	Hashes []uint64
	held   map[string]int
}

// Blocks is the number of leading prompt blocks e holds.
func (m *PrefixMatch) Blocks(e *pool.Endpoint) int {
	if m == nil {
		return 0
	}
	return m.held[e.Key()]
}

// Pct is e's match in percent of the prompt's blocks: blocks · 100 / total (the prefix
// index's own formula, so every reader of a match agrees to the last bit).
func (m *PrefixMatch) Pct(e *pool.Endpoint) float64 {
	n := m.Blocks(e)
	if n == 0 {
		return 0
	}
	return float64(n) * 100 / float64(len(m.Hashes))
}

// Total is the number of prompt blocks matched.
func (m *PrefixMatch) Total() int {
	if m == nil {
		return 0
	}
	return len(m.Hashes)
}

// Blocks are a prompt's prefix blocks as the PD prefix policies (prefix_cache, hybrid_cache_load,
// conductor) match them: the first block hashed in finer sub-blocks (prefix.HashHead), so short
// shared prefixes have affinity too.
type Blocks struct {
	Hashes      []uint64
	Head, Split int
}

// Pct is the match percentage of n leading blocks.
func (b *Blocks) Pct(n int) float64 { return prefix.HeadPct(n, b.Head, b.Split, len(b.Hashes)) }

var blocksKeys sync.Map // int -> StateKey[*Blocks]

// PromptBlocks returns the request's Blocks for blocks of blockTokens tokens, computing them
// once per cycle.
func PromptBlocks(c *Cycle, blockTokens int) *Blocks {
	k, ok := blocksKeys.Load(blockTokens)
	if !ok {
		k, _ = blocksKeys.LoadOrStore(blockTokens, NewStateKey[*Blocks]("prefix.blocks/"+strconv.Itoa(blockTokens)))
	}
	key := k.(StateKey[*Blocks])
	if b, ok := key.Read(c.State); ok {
		return b
	}
	b := &Blocks{Split: prefix.HeadSplit(blockTokens)}
	b.Hashes, b.Head = prefix.HashHead(nil, PrefixText(c), prefix.BlockBytes(blockTokens), b.Split)
	key.Write(c.State, b)
	return b
}

var tokenIDsKey = NewStateKey[string]("prefix.tokenIDs")

// PrefixText is what prefix blocks are cut from: the prompt's bytes (a token is four of them),
// or with AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE=tiktoken its cl100k_base token ids, four bytes
// each, as AIBrix hashes them. Tokenizing costs tens of microseconds per KiB: it is done once per
// cycle, and only when that tokenizer is configured.
func PrefixText(c *Cycle) string {
	if c.Resolved.PD.PrefixCache.TokenizerType != config.TokenizerTiktoken || c.Req.Prompt == "" {
		return c.Req.Prompt
	}
	if s, ok := tokenIDsKey.Read(c.State); ok {
		return s
	}
	ids, err := tokenize.AppendIDs(nil, c.Req.Prompt)
	if err != nil {
		return c.Req.Prompt // the vocabulary is embedded: this cannot fail but on a broken build
	}
	s := string(ids)
	tokenIDsKey.Write(c.State, s)
	return s
}

// hashKeys holds the state key of each block size asked for (a handful per process).
var hashKeys sync.Map // int -> StateKey[[]uint64]

// PromptHashes returns the request's prompt block hashes for blocks of blockTokens tokens,
// computing them once per cycle.
func PromptHashes(c *Cycle, blockTokens int) []uint64 {
	k, ok := hashKeys.Load(blockTokens)
	if !ok {
		k, _ = hashKeys.LoadOrStore(blockTokens, NewStateKey[[]uint64]("prefix.hashes/"+strconv.Itoa(blockTokens)))
	}
	key := k.(StateKey[[]uint64])
	if h, ok := key.Read(c.State); ok {
		return h
	}
	h := prefix.Hash(nil, PrefixText(c), prefix.BlockBytes(blockTokens))
	key.Write(c.State, h)
	return h
}

// prefixSource matches prompts against one index and warms it after the pick: the shared
// index (a prefix-cache-scorer without a producer), or a producer's own.
type prefixSource struct {
	deps  *Deps
	index *prefix.Index // nil: deps.Prefix, read at use
	// blockTokens is the block size; 0 takes the gateway's (AIBRIX_PREFIX_CACHE_BLOCK_SIZE).
	blockTokens int
	// autoTune reads the block size from the first candidate's cache_config_info, and each
	// endpoint's block bound from its GPU blocks, when the engine exports them.
	autoTune bool
	minBlock int // llm-d's floor on the block size (64); 0: none
	// maxBlocks, maxTokens cap the prompt blocks matched (0: no cap); maxTokens wins.
	maxBlocks, maxTokens int
	capacity             int // per-endpoint block bound when warming (0: the index's)
	key                  StateKey[*PrefixMatch]
}

func (s *prefixSource) idx() *prefix.Index {
	if s.index != nil {
		return s.index
	}
	if s.deps != nil {
		return s.deps.Prefix
	}
	return nil
}

func (s *prefixSource) blockSize(c *Cycle) int {
	bs := s.blockTokens
	if s.autoTune && len(c.Candidates) > 0 && s.deps != nil && s.deps.Metrics != nil {
		if smp := s.deps.Metrics.Get(c.Candidates[0].Key()); smp != nil && smp.BlockSize > 0 {
			bs = smp.BlockSize
		}
	}
	if bs <= 0 && s.deps != nil {
		bs = s.deps.PrefixCache.BlockSize
	}
	if bs <= 0 {
		bs = 128
	}
	return max(bs, s.minBlock)
}

// match returns the request's match, computing it once per cycle.
func (s *prefixSource) match(c *Cycle) *PrefixMatch {
	if m, ok := s.key.Read(c.State); ok {
		return m
	}
	bs := s.blockSize(c)
	hashes := PromptHashes(c, bs)
	limit := s.maxBlocks
	if s.maxTokens > 0 {
		limit = s.maxTokens / bs
	}
	if limit > 0 && len(hashes) > limit {
		hashes = hashes[:limit]
	}
	m := &PrefixMatch{Model: c.Req.Model, BlockTokens: bs, Hashes: hashes}
	if ix := s.idx(); ix != nil && len(hashes) > 0 {
		ix.MatchBlocks(c.Req.Model, hashes, func(key string, n int) {
			if m.held == nil {
				m.held = make(map[string]int)
			}
			m.held[key] = n
		})
	}
	s.key.Write(c.State, m)
	return m
}

// warm records that the destination, and the prefill endpoint of a PD decision, now hold
// the prompt (llm-d warms the primary target and the "prefill" profile's).
func (s *prefixSource) warm(c *Cycle, d *Decision) {
	m, ok := s.key.Read(c.State)
	if !ok || len(m.Hashes) == 0 || s.deps == nil {
		return
	}
	for _, eps := range [][]*pool.Endpoint{d.Destination, d.Prefill} {
		if len(eps) > 0 {
			s.deps.WarmIndex(s.idx(), m.Model, m.Hashes, eps[0].Key(), s.capacityOf(eps[0]))
		}
	}
}

func (s *prefixSource) capacityOf(e *pool.Endpoint) int {
	if s.autoTune && s.deps != nil && s.deps.Metrics != nil {
		if smp := s.deps.Metrics.Get(e.Key()); smp != nil && smp.NumGPUBlocks > 0 {
			return smp.NumGPUBlocks
		}
	}
	return s.capacity
}
