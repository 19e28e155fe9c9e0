package sim

import (
	"encoding/binary"
	"hash/fnv"
	"time"
)

// BytesPerToken is the simulator's tokenizer: one token per four bytes of prompt text.
const BytesPerToken = 4

// Params is the latency and capacity model of one pod. Times are model seconds (what the
// simulated GPU would take); PodConfig.TimeScale turns them into wall time. Start with a
// profile (DefaultParams, Llama8BH100, Llama70BH100x8) and change what a test needs: a zero
// field means zero, not "default".
//
// The engine runs iterations, as vLLM's scheduler does (Batch): each iteration carries one
// token for every decoding sequence and prefill chunks of waiting or prefilling prompts, up to
// MaxBatchedTokens tokens in all, and lasts IterationSeconds: the slower of its compute (dense
// layers per token, attention per pair of tokens) and its memory traffic (the weights once, the
// KV every scheduled sequence attends to), as a roofline. README.md gives every profile's sources.
type Params struct {
	// Compute: PrefillPerToken per token the iteration computes (prompt chunk or decode token:
	// the dense layers, 2·params FLOPs ÷ the GPU's sustained FLOP/s) plus PrefillQuadratic per
	// unit of (done+n)² − done² for n tokens attending to done earlier ones (causal attention).
	PrefillPerToken  float64 `json:"prefill_per_token_seconds"`
	PrefillQuadratic float64 `json:"prefill_quadratic_seconds"`
	// PrefillBase is a fixed cost per prompt, paid in the iteration of its first chunk
	// (tokenisation, scheduling; 0 in the calibrated profiles).
	PrefillBase float64 `json:"prefill_base_seconds"`
	// Memory: DecodeBase per iteration (reading the weights), DecodePerSeq per scheduled
	// sequence, DecodePerKVToken per token of KV the scheduled sequences attend to (the KV read).
	DecodeBase       float64 `json:"decode_base_seconds"`
	DecodePerSeq     float64 `json:"decode_per_seq_seconds"`
	DecodePerKVToken float64 `json:"decode_per_kv_token_seconds"`
	// KV transfer on a PD decode leg = TransferBase + TransferPerToken·tokens on the decode pod's
	// inbound link (KV bytes per token ÷ link bandwidth); transfers into one pod queue FIFO.
	TransferBase     float64 `json:"transfer_base_seconds"`
	TransferPerToken float64 `json:"transfer_per_token_seconds"`
	// MaxRunning is the most sequences in the running batch (vLLM's max_num_seqs).
	MaxRunning int `json:"max_running"`
	// MaxBatchedTokens is the token budget of one iteration (vLLM's max_num_batched_tokens):
	// decode tokens first, then prefill chunks. 0 means no budget (a whole prompt in one iteration).
	MaxBatchedTokens int `json:"max_batched_tokens"`
	// PrefillLanes is the most prompts one iteration prefills (0: as many as the budget fits;
	// vLLM packs several short prompts into one iteration).
	PrefillLanes int `json:"prefill_lanes"`
	// KVTokens is the KV capacity. A sequence holds KV blocks for the tokens computed so far and
	// gains a block as its output crosses a block boundary; when none is free, the most recently
	// admitted running sequence is preempted (its KV dropped, recomputed later), as in vLLM.
	KVTokens int `json:"kv_tokens"`
	// BlockSize is the KV block (and prefix-cache block) size in tokens.
	BlockSize int `json:"block_size"`
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

// DefaultParams is the simulator's test profile: a mid-size model whose round numbers make
// tests and the demo easy to reason about (a 10 ms decode step, 20k prompt tokens/s, one
// prompt prefilled at a time in chunks of 2048 tokens). It is not calibrated; the routing
// benchmark uses Llama8BH100.
func DefaultParams() Params {
	return Params{
		PrefillBase: 0.010, PrefillPerToken: 0.00005, PrefillQuadratic: 1e-8,
		DecodeBase: 0.010, DecodePerSeq: 0.0002,
		TransferBase: 0.002, TransferPerToken: 0.000002,
		MaxRunning: 64, MaxBatchedTokens: 2048, PrefillLanes: 1, KVTokens: 131072, BlockSize: 16, DefaultMaxTokens: 16,
		KVHold: 480, BootstrapTimeout: 300,
	}
}

// Llama8BH100 is a Llama-3.1-8B-class dense model (BF16 weights and KV) served by vLLM on one
// H100 SXM 80 GB, calibrated from published measurements (README.md, "Profiles"):
//   - dense compute 2 × 8.03e9 FLOPs per token at 544 TFLOP/s (55 % of 989 dense BF16);
//   - attention 2·layers·hidden = 262,144 FLOPs per unit of n² at 350 TFLOP/s (FlashAttention-2
//     class kernels reach ~35 % of an H100);
//   - memory at 2.58 TB/s (77 % of 3.35 TB/s): 16.06 GB of weights per iteration, 128 KiB of KV
//     per token (32 layers × 8 KV heads × 128 dims × K,V × 2 bytes);
//   - KV transfer over one 400 Gb/s RDMA NIC per GPU at 40 GB/s;
//   - vLLM's H100 defaults: max_num_batched_tokens 8192, max_num_seqs 1024; 400k tokens of KV.
func Llama8BH100() Params {
	const kvBytes = 2 * 32 * 8 * 128 * 2 // bytes of KV per token
	const bw = 0.77 * 3.35e12            // sustained HBM bytes/s
	return Params{
		PrefillPerToken:  2 * 8.03e9 / 544e12,
		PrefillQuadratic: 2 * 32 * 4096 / 350e12,
		DecodeBase:       2 * 8.03e9 / bw,
		DecodePerKVToken: kvBytes / bw,
		TransferBase:     0.001, TransferPerToken: kvBytes / 40e9,
		MaxRunning: 1024, MaxBatchedTokens: 8192, KVTokens: 400_000, BlockSize: 16, DefaultMaxTokens: 16,
		KVHold: 480, BootstrapTimeout: 300,
	}
}

// Llama70BH100x8 is a Llama-3.1-70B-class dense model (BF16) with tensor parallelism over 8
// H100 SXM GPUs of one node, from the same sources as Llama8BH100 with a 0.8 tensor-parallel
// efficiency: 2 × 70.6e9 FLOPs per token, attention 2 × 80 layers × 8192, 141 GB of weights
// and 320 KiB of KV per token (80 layers × 8 KV heads × 128 × 2 × 2 bytes) over 8 × 2.58 TB/s,
// KV transfer over the node's 8 NICs, ~1.25M tokens of KV.
func Llama70BH100x8() Params {
	const kvBytes = 2 * 80 * 8 * 128 * 2
	const tp = 8 * 0.8
	const bw = 0.77 * 3.35e12 * tp
	return Params{
		PrefillPerToken:  2 * 70.6e9 / (544e12 * tp),
		PrefillQuadratic: 2 * 80 * 8192 / (350e12 * tp),
		DecodeBase:       2 * 70.6e9 / bw,
		DecodePerKVToken: kvBytes / bw,
		TransferBase:     0.001, TransferPerToken: kvBytes / (8 * 40e9),
		MaxRunning: 1024, MaxBatchedTokens: 8192, KVTokens: 1_250_000, BlockSize: 16, DefaultMaxTokens: 16,
		KVHold: 480, BootstrapTimeout: 300,
	}
}

// Profiles are the named parameter sets (cmd/sim -profile, bench/quality -profile).
var Profiles = map[string]func() Params{
	"default":         DefaultParams,
	"llama8b-h100":    Llama8BH100,
	"llama70b-h100x8": Llama70BH100x8,
}

// Work is one sequence's share of an iteration: N tokens computed after Done tokens whose KV
// is already there (a prompt chunk, or N = 1 for a decode step). First marks a prompt's first chunk.
type Work struct {
	Done, N int
	First   bool
}

// IterationSeconds is how long one engine iteration carrying work takes: the slower of its
// compute (PrefillPerToken per token, PrefillQuadratic per unit of (Done+N)² − Done²) and its
// memory traffic (DecodeBase, DecodePerSeq per sequence, DecodePerKVToken per token of KV
// attended to), plus PrefillBase per first chunk. So a decode step is memory-bound and a small
// chunk rides along nearly free (Sarathi-Serve's piggybacking), while a large chunk makes every
// decode in its iteration wait for it (prefill–decode interference). 0 for no work.
func IterationSeconds(p Params, work []Work) float64 {
	if len(work) == 0 {
		return 0
	}
	var compute, memory, fixed float64
	memory = p.DecodeBase
	for _, w := range work {
		d, e := float64(w.Done), float64(w.Done+w.N)
		compute += p.PrefillPerToken*float64(w.N) + p.PrefillQuadratic*(e*e-d*d)
		memory += p.DecodePerSeq + p.DecodePerKVToken*d
		if w.First {
			fixed += p.PrefillBase
		}
	}
	return max(compute, memory) + fixed
}

// PrefillSeconds is how long uncached prompt tokens take to prefill alone on an idle pod:
// the iterations of its chunks (at most MaxBatchedTokens each). Its first token comes out at
// the end of the last one.
func PrefillSeconds(p Params, uncached int) float64 {
	total := 0.0
	for done := 0; done < uncached; {
		n := uncached - done
		if p.MaxBatchedTokens > 0 {
			n = min(n, p.MaxBatchedTokens)
		}
		total += IterationSeconds(p, []Work{{Done: done, N: n, First: done == 0}})
		done += n
	}
	return total
}

// InterTokenSeconds is one decode step of batch sequences (at least one) each attending to
// ctx tokens of KV, alone in its iteration.
func InterTokenSeconds(p Params, batch, ctx int) float64 {
	work := make([]Work, max(1, batch))
	for i := range work {
		work[i] = Work{Done: ctx, N: 1}
	}
	return IterationSeconds(p, work)
}

// TransferSeconds is the model time a decode leg's KV of tokens takes on an idle link.
func TransferSeconds(p Params, tokens int) float64 {
	if tokens <= 0 {
		return 0
	}
	return p.TransferBase + p.TransferPerToken*float64(tokens)
}

// Link is a pod's inbound KV-transfer link: transfers run one after another at full
// bandwidth (FIFO), so concurrent pulls into one decode pod queue. Times are model seconds
// on the caller's clock.
type Link struct{ free float64 }

// Reserve books a transfer of the given length starting no earlier than now and returns
// when it ends.
func (l *Link) Reserve(now, seconds float64) float64 {
	start := max(now, l.free)
	l.free = start + seconds
	return l.free
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
