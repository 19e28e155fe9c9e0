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
	if blockBytes < 1 {
		blockBytes = 1
	}
	if n := len(prompt) / blockBytes; cap(dst)-len(dst) < n {
		dst = append(make([]uint64, 0, len(dst)+n), dst...)
	}
	var d xxhash.Digest
	var prev [8]byte
	var h uint64
	for off := 0; off+blockBytes <= len(prompt); off += blockBytes {
		d.Reset()
		binary.LittleEndian.PutUint64(prev[:], h)
		_, _ = d.Write(prev[:])
		_, _ = d.WriteString(prompt[off : off+blockBytes])
		h = d.Sum64()
		dst = append(dst, h)
	}
	return dst
}
