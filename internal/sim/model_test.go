package sim

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestLatencyModel(t *testing.T) {
	p := Params{PrefillBase: 0.01, PrefillPerToken: 0.0001, PrefillQuadratic: 1e-6,
		DecodeBase: 0.01, DecodePerSeq: 0.001, DecodePerKVToken: 0.00001, TransferBase: 0.002, TransferPerToken: 0.00001, BlockSize: 16}
	prefill := []struct {
		uncached int
		want     float64
	}{
		{0, 0},       // nothing to compute
		{1, 0.021},   // memory-bound: max(0.0001 + 1e-6, 0.01 + 0.001) + 0.01
		{100, 0.03},  // compute: 0.01 + 0.01, + 0.01 base
		{1000, 1.11}, // 0.1 + 1: the attention term dominates long prompts
		{2000, 4.21}, // 0.2 + 4
	}
	for _, c := range prefill {
		if got := PrefillSeconds(p, c.uncached); !near(got, c.want) {
			t.Errorf("PrefillSeconds(%d) = %v, want %v", c.uncached, got, c.want)
		}
	}
	// A decode step is memory-bound: weights + per sequence + the KV it reads.
	itl := []struct {
		batch, ctx int
		want       float64
	}{{0, 0, 0.011}, {1, 0, 0.011}, {10, 0, 0.02}, {10, 1000, 0.12}, {64, 100, 0.138}}
	for _, c := range itl {
		if got := InterTokenSeconds(p, c.batch, c.ctx); !near(got, c.want) {
			t.Errorf("InterTokenSeconds(%d, ctx %d) = %v, want %v", c.batch, c.ctx, got, c.want)
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
	var l Link
	if a, b := l.Reserve(1, 0.5), l.Reserve(1.2, 0.5); !near(a, 1.5) || !near(b, 2.0) {
		t.Errorf("two transfers into one link end at %v and %v, want 1.5 and 2.0 (FIFO)", a, b)
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

// An iteration is a roofline: the slower of its compute and its memory traffic, so a small
// chunk next to decodes rides along nearly free and a large one makes them wait.
func TestIterationSeconds(t *testing.T) {
	p := Params{PrefillBase: 0.01, PrefillPerToken: 0.0001, PrefillQuadratic: 1e-6,
		DecodeBase: 0.01, DecodePerKVToken: 0.00001, MaxBatchedTokens: 1000}
	decodes := make([]Work, 10)
	for i := range decodes {
		decodes[i] = Work{Done: 1000, N: 1}
	}
	for _, c := range []struct {
		what string
		work []Work
		want float64
	}{
		{"idle", nil, 0},
		{"10 decodes over 1000 tokens of KV each: memory 0.01 + 0.1", decodes, 0.11},
		{"plus a 50-token chunk: compute 0.006 + 0.0025 stays under memory", append(slices.Clone(decodes), Work{N: 50, First: true}), 0.12},
		{"plus a 1000-token chunk: compute 0.101 + 1 + 0.01 base", append(slices.Clone(decodes), Work{N: 1000, First: true}), 1.12101 + 0.01},
		{"a later chunk attends to the earlier ones", []Work{{Done: 1000, N: 1000}}, 0.1 + 3},
	} {
		if got := IterationSeconds(p, c.work); !near(got, c.want) {
			t.Errorf("%s: %v, want %v", c.what, got, c.want)
		}
	}
	// A 2500-token prompt on an idle pod: chunks of 1000, 1000, 500.
	want := IterationSeconds(p, []Work{{N: 1000, First: true}}) + IterationSeconds(p, []Work{{Done: 1000, N: 1000}}) + IterationSeconds(p, []Work{{Done: 2000, N: 500}})
	if got := PrefillSeconds(p, 2500); !near(got, want) {
		t.Errorf("PrefillSeconds(2500) = %v, want the sum of its chunks %v", got, want)
	}
}

// The calibrated profile's own numbers, next to what they were fitted to (README.md).
func TestLlama8BH100Profile(t *testing.T) {
	p := Llama8BH100()
	for _, c := range []struct {
		what     string
		got      float64
		min, max float64
	}{
		{"8192-token prefill (s)", PrefillSeconds(p, 8192), 0.25, 0.35},
		{"131072-token prefill (s), ~15-20 s on an H100", PrefillSeconds(p, 131072), 14, 20},
		{"decode step, batch 1 (ms)", 1000 * InterTokenSeconds(p, 1, 0), 6, 7},
		{"decode step, batch 32 at 8192 of context (ms)", 1000 * InterTokenSeconds(p, 32, 8192), 18, 22},
	} {
		if c.got < c.min || c.got > c.max {
			t.Errorf("%s = %.4g, want in [%g, %g]", c.what, c.got, c.min, c.max)
		}
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

// Every named profile is a valid pod configuration, and the bigger model is slower per token
// on its 8 GPUs than the 8B on one only where it should be: prefill (≈ 9× the FLOPs on 8×
// the GPUs at 0.8 efficiency) and the weight read.
func TestProfiles(t *testing.T) {
	for name, mk := range Profiles {
		if err := mk().validate(); err != nil {
			t.Errorf("profile %s: %v", name, err)
		}
	}
	small, big := Llama8BH100(), Llama70BH100x8()
	if a, b := PrefillSeconds(small, 8192), PrefillSeconds(big, 8192); b <= a || b > 2*a {
		t.Errorf("8192-token prefill: 8B %.3f s, 70B×8 %.3f s; want the 70B slower but within 2×", a, b)
	}
	if a, b := InterTokenSeconds(small, 1, 0), InterTokenSeconds(big, 1, 0); b <= a || b > 2*a {
		t.Errorf("decode step: 8B %.4f s, 70B×8 %.4f s; want the 70B slower but within 2×", a, b)
	}
}
