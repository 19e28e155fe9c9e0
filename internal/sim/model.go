package sim

import (
	"encoding/binary"
	"hash/fnv"
	"time"
)

// BytesPerToken is the simulator's tokenizer: one token per four bytes of prompt text.
const BytesPerToken = 4

// Params is the latency and capacity model of one pod. Times are model seconds (what the
// simulated GPU would take); PodConfig.TimeScale turns them into wall time. Start with
// DefaultParams() and change what a test needs: a zero field means zero, not "default".
type Params struct {
	// Prefill time = PrefillBase + PrefillPerToken·u + PrefillQuadratic·u², u = uncached prompt tokens.
	PrefillBase      float64 `json:"prefill_base_seconds"`      // default 0.010
	PrefillPerToken  float64 `json:"prefill_per_token_seconds"` // default 0.00005 (20k tokens/s)
	PrefillQuadratic float64 `json:"prefill_quadratic_seconds"` // default 1e-8 (the attention term)
	// Inter-token latency = DecodeBase + DecodePerSeq·batch, batch = running sequences.
	DecodeBase   float64 `json:"decode_base_seconds"`    // default 0.010
	DecodePerSeq float64 `json:"decode_per_seq_seconds"` // default 0.0002
	// KV transfer on a PD decode leg = TransferBase + TransferPerToken·tokens.
	TransferBase     float64 `json:"transfer_base_seconds"`      // default 0.002
	TransferPerToken float64 `json:"transfer_per_token_seconds"` // default 0.000002
	// MaxRunning is the most sequences in the running batch; the rest wait in FIFO order.
	MaxRunning int `json:"max_running"` // default 64
	// PrefillLanes is how many prefills compute at once. Prefill is compute-bound, so a GPU
	// runs about one at a time: concurrent prompts on one pod queue for the lane (FIFO).
	PrefillLanes int `json:"prefill_lanes"` // default 1
	// PrefillChunkTokens is the most uncached prompt tokens one engine iteration prefills
	// (vLLM's max_num_batched_tokens with chunked prefill, 2048 by default). A longer prompt
	// takes several iterations. 0 means no chunking: the whole prompt is one iteration. The
	// iteration that carries a chunk also carries the pod's decode step, so decodes on the
	// same pod stall for the chunk (StepSeconds): prefill–decode interference.
	PrefillChunkTokens int `json:"prefill_chunk_tokens"` // default 2048
	// KVTokens is the KV capacity; a request reserves prompt + output tokens while it runs.
	KVTokens int `json:"kv_tokens"` // default 131072
	// BlockSize is the KV block (and prefix-cache block) size in tokens.
	BlockSize int `json:"block_size"` // default 16
	// DefaultMaxTokens is the output length when a request sets neither max_tokens nor
	// max_completion_tokens. The simulator always generates exactly the asked length.
	DefaultMaxTokens int `json:"default_max_tokens"` // default 16
	// KVHold is how long a prefill pod keeps finished KV for a decode leg to pull (vLLM's
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT, TRT's context cache).
	KVHold float64 `json:"kv_hold_seconds"` // default 480
	// BootstrapTimeout bounds the SGLang room rendezvous and a TRT generation-first leg's
	// wait for its context leg (SGLang's bootstrap timeout).
	BootstrapTimeout float64 `json:"bootstrap_timeout_seconds"` // default 300
}

// DefaultParams is a mid-size model on one modern GPU, close enough to show queueing,
// prefix-cache wins and the PD trade-off.
func DefaultParams() Params {
	return Params{
		PrefillBase: 0.010, PrefillPerToken: 0.00005, PrefillQuadratic: 1e-8,
		DecodeBase: 0.010, DecodePerSeq: 0.0002,
		TransferBase: 0.002, TransferPerToken: 0.000002,
		MaxRunning: 64, PrefillLanes: 1, PrefillChunkTokens: 2048, KVTokens: 131072, BlockSize: 16, DefaultMaxTokens: 16,
		KVHold: 480, BootstrapTimeout: 300,
	}
}

// PrefillSeconds is the model time to prefill uncached prompt tokens.
func PrefillSeconds(p Params, uncached int) float64 {
	if uncached <= 0 {
		return 0
	}
	u := float64(uncached)
	return p.PrefillBase + p.PrefillPerToken*u + p.PrefillQuadratic*u*u
}

// InterTokenSeconds is the model time between two output tokens with batch sequences running.
func InterTokenSeconds(p Params, batch int) float64 {
	if batch < 1 {
		batch = 1
	}
	return p.DecodeBase + p.DecodePerSeq*float64(batch)
}

// PrefillChunk is the size of the next prefill chunk when remaining uncached prompt tokens
// are left to compute: at most PrefillChunkTokens (all of them when chunking is off).
func PrefillChunk(p Params, remaining int) int {
	if remaining <= 0 {
		return 0
	}
	if p.PrefillChunkTokens > 0 && remaining > p.PrefillChunkTokens {
		return p.PrefillChunkTokens
	}
	return remaining
}

// PrefillChunkSeconds is the compute cost of uncached prompt tokens [done, done+n): the
// per-token term for n tokens plus the attention term of those tokens over everything before
// them, (done+n)² − done². PrefillBase is paid once, with the first chunk. So the chunks of
// a prompt add up exactly to PrefillSeconds(uncached): on an idle pod chunking changes nothing.
func PrefillChunkSeconds(p Params, done, n int) float64 {
	if n <= 0 {
		return 0
	}
	d, e := float64(done), float64(done+n)
	s := p.PrefillPerToken*float64(n) + p.PrefillQuadratic*(e*e-d*d)
	if done == 0 {
		s += p.PrefillBase
	}
	return s
}

// StepSeconds is one engine iteration that carries a decode step for decodeBatch running
// sequences (none if decodeBatch is 0) and a prefill chunk costing chunkSeconds (0 if none):
// InterTokenSeconds(decodeBatch) + chunkSeconds. This is the interference: every sequence
// decoding on a pod waits for the chunk, and the chunk waits for the decode step.
// Prefill-role pods decode nothing (no decode term); decode-role pods prefill nothing (no
// chunk term); a combined pod pays both.
func StepSeconds(p Params, decodeBatch int, chunkSeconds float64) float64 {
	s := chunkSeconds
	if decodeBatch > 0 {
		s += InterTokenSeconds(p, decodeBatch)
	}
	return s
}

// TransferSeconds is the model time a decode leg spends pulling tokens of KV from its prefill pod.
func TransferSeconds(p Params, tokens int) float64 {
	if tokens <= 0 {
		return 0
	}
	return p.TransferBase + p.TransferPerToken*float64(tokens)
}

// CachedTokens is how many prompt tokens the prefix cache saves given the number of leading
// blocks it holds. Like vLLM, at least the last prompt token is always computed, so a hit
// covers at most the whole blocks before it.
func CachedTokens(p Params, promptTokens, matchedBlocks int) int {
	if promptTokens <= 0 || p.BlockSize <= 0 {
		return 0
	}
	limit := (promptTokens - 1) / p.BlockSize
	return min(matchedBlocks, limit) * p.BlockSize
}

// Wall turns model seconds into wall time at the given time scale.
func Wall(seconds, scale float64) time.Duration {
	return time.Duration(seconds * scale * float64(time.Second))
}

// Tokenize splits text into tokens of BytesPerToken bytes and gives each a stable id.
func Tokenize(text string) []int64 {
	ids := make([]int64, 0, (len(text)+BytesPerToken-1)/BytesPerToken)
	for i := 0; i < len(text); i += BytesPerToken {
		h := fnv.New32a()
		h.Write([]byte(text[i:min(i+BytesPerToken, len(text))]))
		ids = append(ids, int64(h.Sum32()%100000)+100)
	}
	return ids
}

// BlockHashes hash-chains the full blocks of a token sequence: block i's hash covers every
// token up to the end of block i, so equal hashes mean equal prefixes.
func BlockHashes(ids []int64, blockSize int) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	out := make([]uint64, 0, len(ids)/blockSize)
	var prev uint64
	var buf [8]byte
	for end := blockSize; end <= len(ids); end += blockSize {
		h := fnv.New64a()
		binary.LittleEndian.PutUint64(buf[:], prev)
		h.Write(buf[:])
		for _, id := range ids[end-blockSize : end] {
			binary.LittleEndian.PutUint64(buf[:], uint64(id))
			h.Write(buf[:])
		}
		prev = h.Sum64()
		out = append(out, prev)
	}
	return out
}

// promptHash identifies a whole prompt, so a decode leg can check it got the prefilled one.
func promptHash(ids []int64) uint64 {
	h := fnv.New64a()
	var buf [8]byte
	for _, id := range ids {
		binary.LittleEndian.PutUint64(buf[:], uint64(id))
		h.Write(buf[:])
	}
	return h.Sum64()
}

// outputWords are the simulator's vocabulary; the answer is a pure function of the prompt,
// so the same request gives the same text through any path (combined, PD, sidecar).
var outputWords = []string{" the", " of", " and", " to", " in", " is", " it", " on", " we", " as", " at", " by", " so", " or", " an", " be"}

// outputToken is the i-th output token for a prompt.
func outputToken(prompt uint64, i int) (int64, string) {
	x := prompt ^ (uint64(i+1) * 0x9E3779B97F4A7C15)
	x ^= x >> 29
	k := int(x % uint64(len(outputWords)))
	return int64(k + 10), outputWords[k]
}
