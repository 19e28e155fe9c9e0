package sim

import (
	"math"
	"strings"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestLatencyModel(t *testing.T) {
	p := Params{PrefillBase: 0.01, PrefillPerToken: 0.0001, PrefillQuadratic: 1e-6,
		DecodeBase: 0.01, DecodePerSeq: 0.001, TransferBase: 0.002, TransferPerToken: 0.00001, BlockSize: 16}
	prefill := []struct {
		uncached int
		want     float64
	}{
		{0, 0},        // nothing to compute
		{1, 0.010101}, // 0.01 + 0.0001 + 0.000001
		{100, 0.03},   // 0.01 + 0.01 + 0.01
		{1000, 1.11},  // 0.01 + 0.1 + 1: the attention term dominates long prompts
		{2000, 4.21},  // 0.01 + 0.2 + 4
	}
	for _, c := range prefill {
		if got := PrefillSeconds(p, c.uncached); !near(got, c.want) {
			t.Errorf("PrefillSeconds(%d) = %v, want %v", c.uncached, got, c.want)
		}
	}
	itl := []struct {
		batch int
		want  float64
	}{{0, 0.011}, {1, 0.011}, {10, 0.02}, {64, 0.074}}
	for _, c := range itl {
		if got := InterTokenSeconds(p, c.batch); !near(got, c.want) {
			t.Errorf("InterTokenSeconds(%d) = %v, want %v", c.batch, got, c.want)
		}
	}
	transfer := []struct {
		tokens int
		want   float64
	}{{0, 0}, {100, 0.003}, {1000, 0.012}}
	for _, c := range transfer {
		if got := TransferSeconds(p, c.tokens); !near(got, c.want) {
			t.Errorf("TransferSeconds(%d) = %v, want %v", c.tokens, got, c.want)
		}
	}
	cached := []struct {
		prompt, matched, want int
	}{
		{40, 2, 32}, // two whole blocks hit
		{40, 5, 32}, // only 2 whole blocks lie before the last token
		{32, 2, 16}, // block-aligned prompt: the last token is recomputed, so its block is too
		{33, 2, 32},
		{10, 0, 0},
		{0, 3, 0},
	}
	for _, c := range cached {
		if got := CachedTokens(p, c.prompt, c.matched); got != c.want {
			t.Errorf("CachedTokens(prompt %d, matched %d) = %d, want %d", c.prompt, c.matched, got, c.want)
		}
	}
	if got := Wall(1.5, 0.01); got != 15*time.Millisecond {
		t.Errorf("Wall(1.5 s, 0.01) = %v, want 15ms", got)
	}
}

func TestTokenizeAndBlockHashes(t *testing.T) {
	for _, c := range []struct {
		text string
		want int
	}{{"", 0}, {"abc", 1}, {"abcd", 1}, {"abcdefgh", 2}, {"abcdefghi", 3}} {
		if got := len(Tokenize(c.text)); got != c.want {
			t.Errorf("len(Tokenize(%q)) = %d, want %d", c.text, got, c.want)
		}
	}
	if a, b := Tokenize("abcdabcd"), Tokenize("abcd"); a[0] != a[1] || a[0] != b[0] {
		t.Errorf("equal 4-byte chunks must get equal ids: %v %v", a, b)
	}
	shared := strings.Repeat("x", 64) // 16 tokens = one block
	a := BlockHashes(Tokenize(shared+strings.Repeat("a", 64)), 16)
	b := BlockHashes(Tokenize(shared+strings.Repeat("b", 64)), 16)
	if len(a) != 2 || len(b) != 2 {
		t.Fatalf("want 2 blocks each, got %d and %d", len(a), len(b))
	}
	if a[0] != b[0] || a[1] == b[1] {
		t.Errorf("shared first block must hash equal and the second differ: %v %v", a, b)
	}
	// Chaining: the same second block after a different first block hashes differently.
	c := BlockHashes(Tokenize(strings.Repeat("y", 64)+strings.Repeat("a", 64)), 16)
	if c[1] == a[1] {
		t.Error("block hashes must chain over the prefix")
	}
	if got := len(BlockHashes(make([]int64, 31), 16)); got != 1 {
		t.Errorf("31 tokens make %d full blocks, want 1", got)
	}
}

// Chunked prefill and the interference it causes, with numbers a reader can check by hand:
// b = 0.0001 s/token, c = 1e-6 s/token², a = 0.01 s paid with the first chunk only.
func TestChunkedPrefillAndStep(t *testing.T) {
	p := Params{PrefillBase: 0.01, PrefillPerToken: 0.0001, PrefillQuadratic: 1e-6,
		DecodeBase: 0.01, DecodePerSeq: 0.001, PrefillChunkTokens: 1000}
	chunks := []struct{ remaining, want int }{
		{0, 0}, {1, 1}, {999, 999}, {1000, 1000}, {1001, 1000}, {5000, 1000},
	}
	for _, c := range chunks {
		if got := PrefillChunk(p, c.remaining); got != c.want {
			t.Errorf("PrefillChunk(%d) = %d, want %d", c.remaining, got, c.want)
		}
	}
	off := p
	off.PrefillChunkTokens = 0 // no chunking: the whole prompt in one iteration
	if got := PrefillChunk(off, 5000); got != 5000 {
		t.Errorf("PrefillChunk without chunking = %d, want 5000", got)
	}
	seconds := []struct {
		done, n int
		want    float64
	}{
		{0, 0, 0},
		{0, 1000, 1.11},   // 0.01 + 0.1 + 1e-6·1000²: the same as PrefillSeconds(1000)
		{1000, 1000, 3.1}, // 0.1 + 1e-6·(2000² − 1000²) = 0.1 + 3: the later chunk attends to more
		{2000, 500, 2.3},  // 0.05 + 1e-6·(2500² − 2000²) = 0.05 + 2.25
		{0, 100, 0.03},    // 0.01 + 0.01 + 0.01
	}
	for _, c := range seconds {
		if got := PrefillChunkSeconds(p, c.done, c.n); !near(got, c.want) {
			t.Errorf("PrefillChunkSeconds(done %d, n %d) = %v, want %v", c.done, c.n, got, c.want)
		}
	}
	// The chunks of a 2500-token prompt add up to its unchunked prefill: 1.11 + 3.1 + 2.3 =
	// 6.51 = 0.01 + 0.25 + 6.25.
	if sum, whole := 1.11+3.1+2.3, PrefillSeconds(p, 2500); !near(sum, whole) {
		t.Errorf("chunks add up to %v, PrefillSeconds(2500) = %v", sum, whole)
	}
	steps := []struct {
		decode int
		chunk  float64
		want   float64
	}{
		{0, 0, 0},         // idle
		{0, 1.11, 1.11},   // prefill-role pod: the chunk alone, no decode step
		{10, 0, 0.02},     // decode-role pod: the decode step alone, 0.01 + 10·0.001
		{10, 1.11, 1.13},  // combined pod: one iteration carries both; every decode waits 1.13 s
		{64, 0.03, 0.104}, // 0.074 + 0.03
	}
	for _, c := range steps {
		if got := StepSeconds(p, c.decode, c.chunk); !near(got, c.want) {
			t.Errorf("StepSeconds(decode %d, chunk %v) = %v, want %v", c.decode, c.chunk, got, c.want)
		}
	}
	if d := DefaultParams(); d.PrefillChunkTokens != 2048 {
		t.Errorf("default prefill_chunk_tokens = %d, want 2048 (vLLM's max_num_batched_tokens)", d.PrefillChunkTokens)
	}
}
