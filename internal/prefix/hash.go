package prefix

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// BytesPerToken is the tokenizer Tandem uses for prefix blocks: one token is four bytes of
// prompt text, the same estimate the request parser uses for prompt lengths. A real BPE
// tokenizer (tiktoken) would need a vocabulary file and cost tens of microseconds per KiB
// on the hot path, and block boundaries only have to be stable, not linguistically exact:
// two prompts that share their first N bytes share their first N/4 "tokens" either way, so
// the match percentage of a shared prefix is the same to within one block.
const BytesPerToken = 4

// BlockBytes is the size in bytes of a block of blockTokens tokens (at least one byte).
func BlockBytes(blockTokens int) int {
	if blockTokens < 1 {
		blockTokens = 1
	}
	return blockTokens * BytesPerToken
}

// Hash appends to dst the chained hashes of the prompt's full blocks of blockBytes bytes:
// hash(i) = xxhash64(hash(i-1) || block(i)), hash(-1) = 0, so equal hashes at position i
// mean equal prompts up to the end of block i. A trailing partial block is not hashed: it
// is the part of the prompt most likely to differ, and an engine caches whole blocks too.
func Hash(dst []uint64, prompt string, blockBytes int) []uint64 {
	return chain(dst, prompt, blockBytes, 0)
}

// chain appends the hashes of text's full blocks, chained from the hash h of what precedes text.
// Each block is hashed in one shot (xxhash.Sum64) over a buffer holding the previous hash and the
// block: the same bytes a streaming Digest would be fed, without its per-block Reset and buffering.
func chain(dst []uint64, text string, blockBytes int, h uint64) []uint64 {
	if blockBytes < 1 {
		blockBytes = 1
	}
	n := len(text) / blockBytes
	if n == 0 {
		return dst
	}
	if cap(dst)-len(dst) < n {
		dst = append(make([]uint64, 0, len(dst)+n), dst...)
	}
	// The buffer is on the stack for blocks up to stackBlockBytes (every block size Tandem's
	// configurations use), allocated once per call above.
	var stack [8 + stackBlockBytes]byte
	buf := stack[:]
	if blockBytes > stackBlockBytes {
		buf = make([]byte, 8+blockBytes)
	}
	buf = buf[:8+blockBytes]
	for off := 0; off+blockBytes <= len(text); off += blockBytes {
		binary.LittleEndian.PutUint64(buf, h)
		copy(buf[8:], text[off:off+blockBytes])
		h = xxhash.Sum64(buf)
		dst = append(dst, h)
	}
	return dst
}

// stackBlockBytes is the largest block chain hashes from a stack buffer: 512 tokens.
const stackBlockBytes = 2048

// HeadBlockTokens is the size, in tokens, of the sub-blocks a prompt's first block is hashed in
// (HashHead): a prompt shorter than one block, or prompts sharing only a system prompt shorter
// than one, still have blocks in common.
const HeadBlockTokens = 16

// HeadSplit is how many sub-blocks of HeadBlockTokens the first block of blockTokens tokens is
// hashed in; 1 (no split) for blocks under two sub-blocks.
func HeadSplit(blockTokens int) int {
	return max(blockTokens/HeadBlockTokens, 1)
}

// HashHead appends to dst the chained hashes of text with a finer head: the first split ·
// HeadBlockTokens tokens as split sub-blocks (as many as text fills), then blocks of blockBytes
// bytes, one chain throughout, so equal hashes at position i still mean equal text up to the end
// of unit i. head is the number of sub-block hashes. With split 1 it is Hash.
func HashHead(dst []uint64, text string, blockBytes, split int) (hashes []uint64, head int) {
	if split <= 1 {
		return Hash(dst, text, blockBytes), 0
	}
	sub := BlockBytes(HeadBlockTokens)
	headBytes := min(split*sub, len(text)/sub*sub)
	dst = Hash(dst, text[:headBytes], sub)
	head = headBytes / sub
	if head < split {
		return dst, head
	}
	// Continue the chain from the last sub-block with whole blocks.
	return chain(dst, text[headBytes:], blockBytes, dst[len(dst)-1]), head
}

// HeadPct is the match percentage of n leading hashes of a HashHead layout of total hashes:
// each of the head sub-blocks weighs 1/split of a block, so a match of whole blocks scores what
// it scores without the finer head, and a shorter one its share.
func HeadPct(n, head, split, total int) float64 {
	if total == 0 || n == 0 {
		return 0
	}
	if split <= 1 || head == 0 {
		return float64(n) * 100 / float64(total)
	}
	weight := func(k int) float64 {
		return float64(min(k, head))/float64(split) + float64(max(k-head, 0))
	}
	return weight(n) * 100 / weight(total)
}
