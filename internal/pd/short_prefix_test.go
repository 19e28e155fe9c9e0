package pd

import (
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
)

// TestShortSharedPrefixesGetAffinity: with the default 128-token blocks (512 bytes), a prompt
// under 512 bytes, or prompts sharing only a shorter system prompt, used to hash no block in
// common and so got no prefix affinity. The first block is now hashed in 64-byte sub-blocks, so
// a shared 300-byte system prompt is a 4-sub-block match under the default prefix_cache policy.
// Short prompts: 4 of 7 sub-blocks, a cache term of (100−57.1)·0.1 = 4.3 plus a load term of 1,
// beat 10 for every idle pod, so the warm pod wins even while it carries one request more.
// 3300-byte prompts: 4 sub-blocks of a 6-block prompt is 8.3 %, a cache term of 9.17: the match
// decides between equally loaded pods (before, the choice among them was random), and as in
// AIBrix a small share of a long prompt does not outweigh load.
func TestShortSharedPrefixesGetAffinity(t *testing.T) {
	system := strings.Repeat("You are a helpful assistant. ", 11)[:300]
	for _, tc := range []struct {
		name string
		tail func(i int) string
		load int // requests the warm pod carries
	}{
		{"short prompts", func(i int) string { return strings.Repeat(string(rune('a'+i)), 160) }, 1},
		{"long prompts sharing a short system prompt", func(i int) string { return strings.Repeat(string(rune('a'+i)), 3000) }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, gateway(func(p *config.PD) { p.PrefixCache.StandardDeviationFactor, p.PrefixCache.BlockSize = 100, 128 }),
				P("p0", "r0"), D("d0", "r0"), P("p1", "r1"), D("d1", "r1"), P("p2", "r2"), D("d2", "r2"), P("p3", "r3"), D("d3", "r3"))
			d := h.mustPick(system + tc.tail(0))
			warm := first(d.Prefill)
			d.Lifecycle.Done(nil)
			h.prefillInFlight(warm, tc.load)
			for i := 1; i <= 6; i++ { // by chance alone all six would land on it once in 4096 runs
				d := h.mustPick(system + tc.tail(i))
				if got := first(d.Prefill); got != warm {
					t.Errorf("request %d went to %s; the pod holding the shared system prompt is %s (trace %+v)", i, got, warm, d.Trace.Scores)
				}
				d.Lifecycle.Done(nil)
			}
		})
	}
}
