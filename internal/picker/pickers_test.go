package picker

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/pool"
)

// The pickers' endpoint counts: GIE's and llm-d's maxNumOfEndpoints (all of them, the
// primary included), Tandem's maxFallbacks, Tandem's default of a primary and 2 fallbacks.
func TestPickerParameters(t *testing.T) {
	eps := []*pool.Endpoint{ep("a", "", ""), ep("b", "", ""), ep("c", "", ""), ep("d", "", "")}
	scored := make([]ScoredEndpoint, len(eps))
	for i, e := range eps {
		scored[i] = ScoredEndpoint{Endpoint: e, Score: float64(i)}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	cy := &Cycle{intn: func(n int) int { return rng.IntN(n) }}
	cases := []struct {
		params string
		want   int
		err    string
	}{
		{"", 3, ""},
		{`{"maxNumOfEndpoints": 1}`, 1, ""},
		{`{"maxNumOfEndpoints": 9}`, 4, ""},
		{`{"maxFallbacks": 0}`, 1, ""},
		{`{"maxNumOfEndpoints": 0}`, 0, "maxNumOfEndpoints=0: must be 1 or more"},
		{`{"maxNumOfEndpoints": 2, "maxFallbacks": 1}`, 0, "not both"},
	}
	for _, typ := range []string{TypeMaxScorePicker, TypeRandomPicker} {
		for _, tc := range cases {
			p, err := NewRegistry().New(typ, "", json.RawMessage(tc.params), nil)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("%s %s: error %v, want %q", typ, tc.params, err, tc.err)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			got := p.(Picker).Pick(context.Background(), cy, scored)
			if len(got) != tc.want {
				t.Errorf("%s %s: %d endpoints, want %d", typ, tc.params, len(got), tc.want)
			}
			if typ == TypeMaxScorePicker && got[0] != eps[3] {
				t.Errorf("max-score picked %s first, want d (score 3)", got[0].Name)
			}
		}
	}
}
