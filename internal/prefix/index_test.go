package prefix

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
)

func TestHashChainsFullBlocks(t *testing.T) {
	a := Hash(nil, "aaaabbbbccccdd", 4) // 3 full blocks, "dd" left out
	b := Hash(nil, "aaaabbbbXXXX", 4)
	c := Hash(nil, "XXXXbbbbcccc", 4)
	if len(a) != 3 || len(b) != 3 {
		t.Fatalf("lens %d %d", len(a), len(b))
	}
	if a[0] != b[0] || a[1] != b[1] || a[2] == b[2] {
		t.Fatal("equal prefixes must hash equal, and only them")
	}
	if a[1] == c[1] {
		t.Fatal("block 1 must depend on block 0 (chained)")
	}
	if len(Hash(nil, "abc", 4)) != 0 || BlockBytes(128) != 512 || BlockBytes(0) != 4 {
		t.Fatal("block sizing")
	}
}

func matches(ix *Index, model string, hs []uint64) map[string]float64 {
	m := map[string]float64{}
	ix.Match(model, hs, func(k string, pct float64) { m[k] = pct })
	return m
}

func TestMatchPercentages(t *testing.T) {
	clock := load.NewManualClock(time.Unix(1000, 0))
	ix := NewIndex(Options{Clock: clock, Eviction: time.Minute})
	hs := Hash(nil, strings.Repeat("0123456789abcdef", 8), 16) // 8 blocks
	ix.Add("m", hs[:2], "a")                                   // 2 of 8 = 25%
	ix.Add("m", hs, "b")                                       // 100%
	ix.Add("other", hs, "c")                                   // another model
	got := matches(ix, "m", hs)
	if len(got) != 2 || got["a"] != 25 || got["b"] != 100 {
		t.Fatalf("%v", got)
	}
	// A prompt diverging after block 4: b matches 5 of 6 blocks of the new prompt.
	other := Hash(nil, strings.Repeat("0123456789abcdef", 5)+"zzzzzzzzzzzzzzzz", 16)
	if got := matches(ix, "m", other); got["b"] != 500.0/6 || got["a"] != 200.0/6 {
		t.Fatalf("%v", got)
	}
	// Age eviction: b warmed again later, a not.
	clock.Advance(40 * time.Second)
	ix.Add("m", hs, "b")
	clock.Advance(30 * time.Second)
	if got := matches(ix, "m", hs); len(got) != 1 || got["b"] != 100 {
		t.Fatalf("after a's eviction age: %v", got)
	}
}

func TestMaxBlocksEvictsLeastRecentFromTheTail(t *testing.T) {
	ix := NewIndex(Options{MaxBlocks: 10})
	p1 := Hash(nil, strings.Repeat("a", 16*8), 16) // 8 blocks
	p2 := Hash(nil, strings.Repeat("b", 16*6), 16) // 6 blocks
	ix.Add("m", p1, "x")
	ix.Add("m", p2, "y")
	if ix.Len() != 10 {
		t.Fatalf("len %d", ix.Len())
	}
	// p1 lost its 4 last blocks (tail first), and keeps a usable 4-block prefix.
	if got := matches(ix, "m", p1); got["x"] != 50 {
		t.Fatalf("%v", got)
	}
	if got := matches(ix, "m", p2); got["y"] != 100 {
		t.Fatalf("%v", got)
	}
	ix.Forget("y")
	if ix.Len() != 4 || len(matches(ix, "m", p2)) != 0 {
		t.Fatalf("forget: len %d", ix.Len())
	}
}

func TestConcurrentMatchAndAdd(t *testing.T) {
	ix := NewIndex(Options{MaxBlocks: 500})
	w := NewWarmer(ix, 16)
	ctx := t.Context()
	go w.Run(ctx)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				hs := Hash(nil, fmt.Sprintf("%04d-%s", i%20, strings.Repeat("q", 200)), 16)
				ix.Match("m", hs, func(string, float64) {})
				if i%2 == 0 {
					ix.Add("m", hs, fmt.Sprintf("e%d", g))
				} else {
					w.Warm("m", hs, fmt.Sprintf("e%d", g))
				}
			}
		})
	}
	wg.Wait()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if ix.Len() > 500 {
		t.Fatalf("len %d above MaxBlocks", ix.Len())
	}
}

// A system prompt every endpoint holds: matching stays linear in the holders walked, and
// only the endpoint holding the whole prompt matches it fully.
func TestSharedPrefixOnManyEndpoints(t *testing.T) {
	ix := NewIndex(Options{})
	system := strings.Repeat("You are a helpful assistant. ", 64) // 1856 bytes
	full := Hash(nil, system+strings.Repeat("question ", 200), 64)
	sys := Hash(nil, system, 64) // the system prompt's 29 full blocks
	for i := range 1000 {
		ix.Add("m", sys, fmt.Sprintf("e%d", i))
	}
	ix.Add("m", full, "e7")
	got := matches(ix, "m", full)
	if len(got) != 1000 || got["e7"] != 100 || got["e8"] != float64(len(sys))*100/float64(len(full)) {
		t.Fatalf("%d matches, e7 %v, e8 %v", len(got), got["e7"], got["e8"])
	}
}

// A per-endpoint bound (llm-d's lruCapacityPerServer) makes each endpoint forget its least
// recently warmed blocks, and only its own: worked by hand with a bound of 3 blocks.
func TestPerHolderCapacity(t *testing.T) {
	ix := NewIndex(Options{MaxBlocksPerHolder: 3})
	p := Hash(nil, strings.Repeat("0123456789abcdef", 4), 16) // 4 blocks
	q := Hash(nil, strings.Repeat("fedcba9876543210", 2), 16) // 2 other blocks
	ix.Add("m", p, "a")                                       // a keeps p's first 3 blocks: Add warms the tail first, the head last
	ix.Add("m", p, "b")
	if got := matches(ix, "m", p); got["a"] != 75 || got["b"] != 75 {
		t.Fatalf("bound 3 of 4 blocks: %v", got)
	}
	if ix.Len() != 3 {
		t.Fatalf("%d blocks held, want 3 (the 4th has no holder left)", ix.Len())
	}
	ix.Add("m", q, "a") // a now holds q (2) + the most recent block of p (p[0])
	if got := matches(ix, "m", p); got["a"] != 25 || got["b"] != 75 {
		t.Fatalf("after a warms another prompt: %v", got)
	}
	if got := matches(ix, "m", q); got["a"] != 100 || got["b"] != 0 {
		t.Fatalf("q: %v", got)
	}
	// A bound passed with the warm (autoTune's per-pod GPU blocks) wins for that endpoint.
	ix.AddCapped("m", p, "c", 1)
	if got := matches(ix, "m", p); got["c"] != 25 {
		t.Fatalf("capped at 1: %v", got)
	}
	ix.Forget("a")
	if got := matches(ix, "m", q); len(got) != 0 || ix.Len() != 3 {
		t.Fatalf("after forgetting a: %v, %d blocks", got, ix.Len())
	}
}
