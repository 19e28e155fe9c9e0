package prefix

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The prefix work of a pick on bench/picker's traffic: 32 KiB prompts (16 shared 24 KiB
// prefixes, each prompt its own 8 KiB tail) in 128-token blocks with the finer head, against an
// index warmed by 128 endpoints. `go test -bench . ./internal/prefix/`.
const (
	benchPromptBytes = 32 << 10
	benchEndpoints   = 128
	benchBlockTokens = 128
)

type benchTraffic struct {
	prompts []string
	hashes  [][]uint64
	keys    []string
	ix      *Index
}

func newBenchTraffic(b *testing.B, capacity int) *benchTraffic {
	b.Helper()
	rng := rand.New(rand.NewPCG(42, 11))
	text := func(n int) string {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte('a' + rng.IntN(26))
		}
		return string(p)
	}
	t := &benchTraffic{ix: NewIndex(Options{MaxBlocksPerHolder: capacity})}
	prefixes := make([]string, 16)
	for i := range prefixes {
		prefixes[i] = text(24 << 10)
	}
	for i := range 256 {
		p := prefixes[i%len(prefixes)] + text(benchPromptBytes-24<<10)
		hs, _ := HashHead(nil, p, BlockBytes(benchBlockTokens), HeadSplit(benchBlockTokens))
		t.prompts, t.hashes = append(t.prompts, p), append(t.hashes, hs)
	}
	for i := range benchEndpoints {
		t.keys = append(t.keys, fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250))
	}
	// Every endpoint has served some prompts of every prefix: the shared blocks have about
	// 128 holders, each prompt's tail a few.
	for range 8 * len(t.prompts) {
		t.ix.Add("bench", t.hashes[rng.IntN(len(t.hashes))], t.keys[rng.IntN(len(t.keys))])
	}
	return t
}

func BenchmarkHashHead32K(b *testing.B) {
	t := newBenchTraffic(b, 0)
	b.SetBytes(benchPromptBytes)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		HashHead(nil, t.prompts[i%len(t.prompts)], BlockBytes(benchBlockTokens), HeadSplit(benchBlockTokens))
	}
}

func BenchmarkMatchBlocks32K128(b *testing.B) {
	t := newBenchTraffic(b, 0)
	b.ReportAllocs()
	b.ResetTimer()
	found := 0
	for i := range b.N {
		t.ix.MatchBlocks("bench", t.hashes[i%len(t.hashes)], func(string, int) { found++ })
	}
	b.ReportMetric(float64(found)/float64(b.N), "holders/op")
}

// BenchmarkAddCapped32K128 is one warm of a pick, the background warmer's work, with and
// without llm-d's per-endpoint bound.
func BenchmarkAddCapped32K128(b *testing.B) {
	for _, capacity := range []int{0, 4096} {
		b.Run(fmt.Sprintf("cap=%d", capacity), func(b *testing.B) {
			t := newBenchTraffic(b, capacity)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				t.ix.Add("bench", t.hashes[i%len(t.hashes)], t.keys[(i*7)%len(t.keys)])
			}
		})
	}
}

// BenchmarkHashMatchWarming32K128 is a pick's prefix work — hashing the prompt, matching it,
// queueing its warm — with the warmer applying the warms in the background, as in the picker.
func BenchmarkHashMatchWarming32K128(b *testing.B) {
	t := newBenchTraffic(b, 0)
	w := NewWarmer(t.ix, 4096)
	ctx := b.Context()
	go w.Run(ctx)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		hs, _ := HashHead(nil, t.prompts[i%len(t.prompts)], BlockBytes(benchBlockTokens), HeadSplit(benchBlockTokens))
		t.ix.MatchBlocks("bench", hs, func(string, int) {})
		w.Warm("bench", hs, t.keys[(i*7)%len(t.keys)])
	}
	b.StopTimer()
	if err := w.Flush(ctx); err != nil {
		b.Fatal(err)
	}
}
