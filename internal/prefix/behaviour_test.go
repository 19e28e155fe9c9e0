package prefix

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
)

type reported struct {
	key    string
	blocks int
}

func matchList(match func(string, []uint64, func(string, int)), model string, hs []uint64) []reported {
	var out []reported
	match(model, hs, func(k string, n int) { out = append(out, reported{k, n}) })
	return out
}

// The index answers every match as it did before (same endpoints, same block counts, same
// order) through random warms of random prefixes with per-endpoint bounds passed and defaulted,
// the global bound, two models, aging past the eviction age (and a clock stepping back),
// forgotten endpoints, and endpoints numerous enough to need several words of bits per block.
func TestIndexBehavesAsBefore(t *testing.T) {
	for seed := range 40 {
		rng := rand.New(rand.NewPCG(uint64(seed), 18))
		clock := load.NewManualClock(time.Unix(1_700_000_000, 0))
		opts := Options{MaxBlocks: 20 + rng.IntN(200), MaxBlocksPerHolder: rng.IntN(3) * 10,
			Eviction: time.Duration(5+rng.IntN(30)) * time.Second, Clock: clock}
		ix, ref := NewIndex(opts), newRefIndex(opts)
		endpoints := 3 + rng.IntN(150)
		prompts := make([][]uint64, 12)
		for i := range prompts {
			shared := strings.Repeat(fmt.Sprintf("system %d ", i%3), 2+rng.IntN(30))
			prompts[i] = Hash(nil, shared+strings.Repeat(fmt.Sprint(i), rng.IntN(300)), 16)
		}
		models := []string{"m", "n"}
		for step := range 600 {
			p := prompts[rng.IntN(len(prompts))]
			key := fmt.Sprintf("e%d", rng.IntN(endpoints))
			model := models[rng.IntN(4)/3]
			switch r := rng.IntN(40); {
			case r == 0:
				ix.Forget(key)
				ref.Forget(key)
			case r == 1:
				gone := map[string]struct{}{key: {}}
				for range rng.IntN(endpoints / 2) {
					gone[fmt.Sprintf("e%d", rng.IntN(endpoints))] = struct{}{}
				}
				ix.ForgetAll(gone)
				ref.ForgetAll(gone)
			default:
				hs, capacity := p[:rng.IntN(len(p)+1)], rng.IntN(3)*6
				ix.AddCapped(model, hs, key, capacity)
				ref.AddCapped(model, hs, key, capacity)
			}
			switch r := rng.IntN(50); {
			case r == 0:
				clock.Advance(opts.Eviction + time.Second)
			case r == 1:
				clock.Advance(-time.Duration(rng.IntN(3000)) * time.Millisecond)
			default:
				clock.Advance(time.Duration(rng.IntN(800)) * time.Millisecond)
			}
			if ix.Len() != ref.Len() {
				t.Fatalf("seed %d step %d: %d blocks, before %d", seed, step, ix.Len(), ref.Len())
			}
			for range 3 {
				q, model := prompts[rng.IntN(len(prompts))], models[rng.IntN(2)]
				q = q[:rng.IntN(len(q)+1)]
				got, want := matchList(ix.MatchBlocks, model, q), matchList(ref.MatchBlocks, model, q)
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d: matched %v, before %v", seed, step, got, want)
				}
			}
			checkHeld(t, ix)
			checkKeyTable(t, ix)
		}
	}
}

// checkHeld: each block's bits are exactly its holders' numbers, oldest bounds their
// warms, a block in the map has holders, and a block's successor, when it has holders (it was
// not dropped), is the block its model maps its hash to.
func checkHeld(t *testing.T, ix *Index) {
	t.Helper()
	for _, m := range ix.models {
		for _, b := range m {
			if len(b.holders) == 0 {
				t.Fatalf("block %x in the map has no holders", b.hash)
			}
			if s := b.succ; s != nil && len(s.holders) > 0 && m[s.hash] != s {
				t.Fatalf("block %x: its successor %x has holders and is not the map's", b.hash, s.hash)
			}
			var want []uint64
			for _, h := range b.holders {
				for len(want) <= int(h.id>>6) {
					want = append(want, 0)
				}
				want[h.id>>6] |= 1 << (h.id & 63)
				if h.seen < b.oldest {
					t.Fatalf("block %x: holder %s warmed at %d, before the block's oldest %d", b.hash, h.key, h.seen, b.oldest)
				}
			}
			for len(want) < len(b.held) {
				want = append(want, 0)
			}
			if !slices.Equal(want, b.held) {
				t.Fatalf("block %x: bits %b, holders %b", b.hash, b.held, want)
			}
		}
	}
}
