package prefix

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
)

// referenceMatch is MatchBlocks as a map of runs keyed by endpoint key, walked over the
// same blocks: what matching computed before endpoints were numbered.
func referenceMatch(ix *Index, model string, hashes []uint64) map[string]int {
	cutoff := ix.opts.Clock.Now().Add(-ix.opts.Eviction).UnixNano()
	run := map[string]int{}
	m := ix.models[model]
	for i, h := range hashes {
		b := m[h]
		if b == nil {
			break
		}
		extended := 0
		for _, hd := range b.holders {
			if hd.seen < cutoff {
				continue
			}
			if i == 0 {
				run[hd.key] = 1
				extended++
			} else if run[hd.key] == i {
				run[hd.key] = i + 1
				extended++
			}
		}
		if extended == 0 {
			break
		}
	}
	return run
}

// Numbered endpoints match as keyed ones did, through warms, per-endpoint bounds, the
// global bound, eviction by age and forgotten endpoints; and a number is held exactly while
// some block names its endpoint, then reused.
func TestNumberedKeysMatchAsKeyedRuns(t *testing.T) {
	for seed := range 20 {
		rng := rand.New(rand.NewPCG(uint64(seed), 3))
		clock := load.NewManualClock(time.Unix(1_700_000_000, 0))
		ix := NewIndex(Options{MaxBlocks: 10 + rng.IntN(40), MaxBlocksPerHolder: rng.IntN(3) * 8,
			Eviction: time.Duration(5+rng.IntN(30)) * time.Second, Clock: clock})
		prompts := make([][]uint64, 6)
		for i := range prompts {
			prompts[i] = Hash(nil, strings.Repeat(fmt.Sprintf("shared %d ", i%2), 4+rng.IntN(40))+strings.Repeat(fmt.Sprint(i), rng.IntN(200)), 16)
		}
		for step := range 400 {
			p := prompts[rng.IntN(len(prompts))]
			key := fmt.Sprintf("e%d", rng.IntN(30))
			switch rng.IntN(10) {
			case 0:
				ix.Forget(key)
			case 1:
				ix.ForgetAll(map[string]struct{}{key: {}, fmt.Sprintf("e%d", rng.IntN(30)): {}})
			default:
				ix.AddCapped("m", p[:rng.IntN(len(p)+1)], key, rng.IntN(3)*4)
			}
			clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
			q := prompts[rng.IntN(len(prompts))]
			got := map[string]int{}
			ix.MatchBlocks("m", q, func(key string, n int) {
				if _, dup := got[key]; dup {
					t.Fatalf("seed %d step %d: %s reported twice", seed, step, key)
				}
				got[key] = n
			})
			want := referenceMatch(ix, "m", q)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("seed %d step %d: matched %v, keyed runs %v", seed, step, got, want)
			}
			checkKeyTable(t, ix)
		}
	}
}

func checkKeyTable(t *testing.T, ix *Index) {
	t.Helper()
	refs := map[int32]int32{}
	for _, m := range ix.models {
		for _, b := range m {
			for _, h := range b.holders {
				if ix.keys.names[h.id] != h.key || ix.keys.ids[h.key] != h.id {
					t.Fatalf("holder %s numbered %d, which names %q", h.key, h.id, ix.keys.names[h.id])
				}
				refs[h.id]++
			}
		}
	}
	if len(ix.keys.ids) != len(refs) || len(ix.keys.ids)+len(ix.keys.free) != len(ix.keys.names) {
		t.Fatalf("%d numbers in use, %d held, %d free of %d", len(ix.keys.ids), len(refs), len(ix.keys.free), len(ix.keys.names))
	}
	for id, n := range refs {
		if ix.keys.refs[id] != n {
			t.Fatalf("number %d (%s): %d refs counted, %d holders", id, ix.keys.names[id], ix.keys.refs[id], n)
		}
	}
}
