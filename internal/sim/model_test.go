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
