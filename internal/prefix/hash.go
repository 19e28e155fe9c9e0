package prefix

import "math/bits"

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
func chain(dst []uint64, text string, blockBytes int, h uint64) []uint64 {
	if blockBytes < 1 {
		blockBytes = 1
	}
	if n := len(text) / blockBytes; cap(dst)-len(dst) < n {
		dst = append(make([]uint64, 0, len(dst)+n), dst...)
	}
	for off := 0; off+blockBytes <= len(text); off += blockBytes {
		h = sumChained(h, text[off:off+blockBytes])
		dst = append(dst, h)
	}
	return dst
}

// xxhash64's primes.
const (
	prime1 = 11400714785074694791
	prime2 = 14029467366897019727
	prime3 = 1609587929392839161
	prime4 = 9650029242287828579
	prime5 = 2870177450012600261

	// The first and last lanes' seeds, prime1 + prime2 and -prime1 modulo 2^64.
	prime1plus2 = (prime1 + prime2) % (1 << 64)
	negPrime1   = (1 << 64) - prime1
)

// sumChained is xxhash64 (seed 0) of the 8 little-endian bytes of prev followed by block:
// xxhash.Sum64 of that concatenation, read where it lies instead of copied together or
// streamed through a Digest. The algorithm is xxHash's XXH64 as cespare/xxhash implements it;
// TestHashEqualsStreamingDigest holds the two to the same values.
func sumChained(prev uint64, block string) uint64 {
	n := 8 + len(block)
	var h uint64
	b := block // what is left to read
	if n >= 32 {
		v1, v2, v3, v4 := uint64(prime1plus2), uint64(prime2), uint64(0), uint64(negPrime1)
		// The first stripe: prev, then block's first 24 bytes.
		v1 = round(v1, prev)
		v2 = round(v2, u64(b[0:8]))
		v3 = round(v3, u64(b[8:16]))
		v4 = round(v4, u64(b[16:24]))
		for b = b[24:]; len(b) >= 32; b = b[32:] {
			v1 = round(v1, u64(b[0:8]))
			v2 = round(v2, u64(b[8:16]))
			v3 = round(v3, u64(b[16:24]))
			v4 = round(v4, u64(b[24:32]))
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = mergeRound(h, v1)
		h = mergeRound(h, v2)
		h = mergeRound(h, v3)
		h = mergeRound(h, v4)
		h += uint64(n)
	} else {
		h = prime5 + uint64(n)
		h ^= round(0, prev)
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	for ; len(b) >= 8; b = b[8:] {
		h ^= round(0, u64(b[:8]))
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if len(b) >= 4 {
		h ^= uint64(u32(b[:4])) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
		b = b[4:]
	}
	for ; len(b) > 0; b = b[1:] {
		h ^= uint64(b[0]) * prime5
		h = bits.RotateLeft64(h, 11) * prime1
	}
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

func round(acc, input uint64) uint64 {
	acc += input * prime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * prime1
}

func mergeRound(acc, val uint64) uint64 {
	val = round(0, val)
	acc ^= val
	return acc*prime1 + prime4
}

// u64 and u32 read the little-endian word s starts with (the compiler makes each one load).
func u64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func u32(s string) uint32 {
	_ = s[3]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

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
	// Room for every hash at once: the sub-blocks, then the blocks after them.
	if n := headBytes/sub + (len(text)-headBytes)/max(blockBytes, 1); cap(dst)-len(dst) < n {
		dst = append(make([]uint64, 0, len(dst)+n), dst...)
	}
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
