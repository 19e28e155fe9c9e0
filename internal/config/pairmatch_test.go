package config

import (
	"slices"
	"testing"

	"github.com/tandem-epp/tandem/internal/pool"
)

// TANDEM_PAIR_MATCH_LABELS as the pool sources see it: the default, a list, and none.
func TestPairMatchLabels(t *testing.T) {
	cases := []struct {
		env  string
		want pool.PairMatch
	}{
		{"", pool.DefaultPairMatch},
		{"none", nil},
		{" none ", nil},
		{"app.kubernetes.io/version, example.com/rev", pool.PairMatch{"app.kubernetes.io/version", "example.com/rev"}},
	}
	for _, tc := range cases {
		g, _, err := FromEnv(func(k string) string {
			if k == "TANDEM_PAIR_MATCH_LABELS" {
				return tc.env
			}
			return ""
		})
		if err != nil {
			t.Fatalf("%q: %v", tc.env, err)
		}
		if got := g.PairMatch(); !slices.Equal(got, tc.want) {
			t.Errorf("%q: PairMatch %q, want %q", tc.env, got, tc.want)
		}
	}
	for _, bad := range []string{"a b", "rev,rev", "-bad/key"} {
		if _, _, err := FromEnv(func(k string) string {
			if k == "TANDEM_PAIR_MATCH_LABELS" {
				return bad
			}
			return ""
		}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
