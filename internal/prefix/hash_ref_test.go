package prefix

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// referenceChain is chain as it was first written, a streaming Digest reset for every block:
// the hashes are a contract (they are compared across replicas through Redis and against
// AIBrix's), so the one-shot hashing must reproduce them bit for bit.
func referenceChain(dst []uint64, text string, blockBytes int, h uint64) []uint64 {
	if blockBytes < 1 {
		blockBytes = 1
	}
	var d xxhash.Digest
	var prev [8]byte
	for off := 0; off+blockBytes <= len(text); off += blockBytes {
		d.Reset()
		binary.LittleEndian.PutUint64(prev[:], h)
		_, _ = d.Write(prev[:])
		_, _ = d.WriteString(text[off : off+blockBytes])
		h = d.Sum64()
		dst = append(dst, h)
	}
	return dst
}

// referenceHashHead is HashHead over referenceChain.
func referenceHashHead(text string, blockBytes, split int) ([]uint64, int) {
	if split <= 1 {
		return referenceChain(nil, text, blockBytes, 0), 0
	}
	sub := BlockBytes(HeadBlockTokens)
	headBytes := min(split*sub, len(text)/sub*sub)
	dst := referenceChain(nil, text[:headBytes], sub, 0)
	head := headBytes / sub
	if head < split {
		return dst, head
	}
	return referenceChain(dst, text[headBytes:], blockBytes, dst[len(dst)-1]), head
}

// Random prompts of random lengths, hashed in random block sizes (tiny ones, the common 64 to
// 512 tokens, and blocks past the stack buffer) with and without a finer head, hash as the
// streaming Digest did; appending to a non-empty dst keeps what was there.
func TestHashEqualsStreamingDigest(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 1))
	sizes := []int{1, 3, 4, 7, 16, 64, 100, 256, 512, 1024, 2047, 2048, 2049, 4096, 8192}
	for i := range 400 {
		text := make([]byte, rng.IntN(40<<10))
		for j := range text {
			text[j] = byte(rng.IntN(256))
		}
		bs := sizes[rng.IntN(len(sizes))]
		if i%3 == 0 {
			bs = 1 + rng.IntN(3000)
		}
		got := Hash([]uint64{42}, string(text), bs)
		want := referenceChain([]uint64{42}, string(text), bs, 0)
		if !equalHashes(got, want) {
			t.Fatalf("prompt %d (%d bytes), blocks of %d: hashes differ from the streaming digest's", i, len(text), bs)
		}
		tokens := max(bs/BytesPerToken, 1)
		gotH, headH := HashHead(nil, string(text), BlockBytes(tokens), HeadSplit(tokens))
		wantH, wantHead := referenceHashHead(string(text), BlockBytes(tokens), HeadSplit(tokens))
		if headH != wantHead || !equalHashes(gotH, wantH) {
			t.Fatalf("prompt %d (%d bytes), %d-token blocks: HashHead differs (head %d, want %d)", i, len(text), tokens, headH, wantHead)
		}
	}
}

func equalHashes(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Every block length from 1 to 1100 bytes (each XXH64 tail: the 32-byte stripes and the 8-,
// 4- and 1-byte rests, with the 8 bytes of the previous hash in front), at several offsets
// into the text and several previous hashes, hashes as the streaming Digest does.
func TestHashEveryBlockLength(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 2))
	text := make([]byte, 4096)
	for j := range text {
		text[j] = byte(rng.IntN(256))
	}
	for bs := 1; bs <= 1100; bs++ {
		for _, off := range []int{0, 1, 3, 7} {
			for _, prev := range []uint64{0, 1, 0x9e3779b97f4a7c15, ^uint64(0)} {
				s := string(text[off : off+2*bs+5]) // two whole blocks and a partial one
				got := chain(nil, s, bs, prev)
				want := referenceChain(nil, s, bs, prev)
				if !equalHashes(got, want) {
					t.Fatalf("blocks of %d bytes at offset %d, previous hash %#x: %v, want %v", bs, off, prev, got, want)
				}
			}
		}
	}
}
