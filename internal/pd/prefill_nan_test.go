package pd

import (
	"math"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
)

// nanPrefill is a registered prefill policy that cannot score some pods (NaN) and scores
// the others 1.
type nanPrefill struct{ nan map[string]bool }

func (nanPrefill) Name() string     { return "nan" }
func (nanPrefill) UsesPrefix() bool { return false }
func (p nanPrefill) Score(b *PrefillBatch, i int) float64 {
	if p.nan[b.Pods[i].Endpoint.Name] {
		return math.NaN()
	}
	return 1
}

// A prefill score of NaN leaves that pod out, as a NaN decode score does (after its
// load_balancing retry): it must neither become its roleset's best (NaN compares false, so
// it would never be replaced) nor the batch maximum (max(1, NaN) = NaN makes every final
// score NaN, and the request fails with no_pd_pair although valid pairs exist).
// Worked by hand: the other pods score 1, max = 1, so the surviving pair's final score is
// 1/1 + decode/maxDecode.
func TestPrefillNaNScoreSkipsThePod(t *testing.T) {
	cases := []struct {
		name    string
		nan     []string
		prefill string
	}{
		{"first pod of the roleset NaN: the second wins", []string{"pA1"}, "pA2"},
		{"second pod NaN: the first wins", []string{"pA2"}, "pA1"},
		{"a whole roleset NaN: the other roleset wins", []string{"pA1", "pA2"}, "pB"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gw := gateway(func(g *config.PD) { g.PrefillScorePolicy, g.DecodeScorePolicy = "nan", PolicyLeastRequest })
			accepted := config.DefaultNames()
			accepted.PrefillPolicies = append(accepted.PrefillPolicies, "nan")
			h := newHarnessNames(t, gw, accepted, P("pA1", "A"), P("pA2", "A"), D("dA", "A"), P("pB", "B"), D("dB", "B"))
			pol := nanPrefill{nan: map[string]bool{}}
			for _, n := range tc.nan {
				pol.nan[n] = true
			}
			h.c.Policies().RegisterPrefill(pol)
			// Roleset B's decode pod is busier, so B wins only when A has no prefill pod left.
			h.pendingDecode("dB", 1)
			d, err := h.pick(prompt("x", 8), nil)
			if err != nil {
				t.Fatalf("pick failed: %v", err)
			}
			if first(d.Prefill) != tc.prefill {
				t.Fatalf("prefill %v, want %s (scores %v)", names(d.Prefill), tc.prefill, d.Trace.Scores)
			}
		})
	}
}
