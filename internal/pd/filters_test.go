package pd

import (
	"context"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

func podOf(name string, labels map[string]string, routing string) *pool.Endpoint {
	ann := map[string]string{}
	if routing != "" {
		ann[pool.AnnotationConfig] = `{"profiles": {"default": {"routingConfig": ` + routing + `}}}`
	}
	return pool.NewEndpoint("ns", name, "10.6.0.1", 8000, 0, labels, ann)
}

// The seed's filters, pod by pod: the role a pd-role-filter keeps, and the prompt lengths
// a bucketed pod serves (its range [min, max], 0 max unlimited, no annotation any length).
func TestSeedFilters(t *testing.T) {
	res, err := config.NewResolver(config.DefaultGateway(), config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pods := []*pool.Endpoint{
		podOf("p", map[string]string{pool.LabelRoleName: "prefill"}, `{"promptLenBucketMaxLength": 100}`),
		podOf("d", map[string]string{pool.LabelLLMDRole: "decode"}, `{"promptLenBucketMinLength": 50}`),
		podOf("c", nil, `{"combined": true}`),
		podOf("both", map[string]string{pool.LabelLLMDRole: "both"}, ""),
		podOf("s", nil, ""),
	}
	cycle := func(tokens int, bucketing bool) *picker.Cycle {
		cy := &picker.Cycle{Req: &request.Request{PromptTokens: tokens}, State: &picker.CycleState{},
			PodRouting: func(e *pool.Endpoint) config.RoutingConfig { return res.PodRouting(e, "default") }}
		cy.Resolved.PD.PromptLengthBucketing = bucketing
		return cy
	}
	names := func(eps []*pool.Endpoint) string {
		s := ""
		for _, e := range eps {
			s += e.Name + " "
		}
		return s
	}
	cases := []struct {
		filter    picker.Filter
		tokens    int
		bucketing bool
		want      string
	}{
		{NewRoleFilter(RolePrefill), 10, false, "p "},
		{NewRoleFilter(RoleDecode), 10, false, "d "},
		{NewRoleFilter(RoleCombined), 10, false, "c both "},
		{NewBucketFilter(), 10, false, "p d c both s "}, // bucketing off: every pod
		{NewBucketFilter(), 10, true, "p c both s "},    // d starts at 50
		{NewBucketFilter(), 100, true, "p d c both s "}, // 100 is in both ranges (inclusive)
		{NewBucketFilter(), 101, true, "d c both s "},   // p ends at 100
	}
	for _, tc := range cases {
		if got := names(tc.filter.Filter(context.Background(), cycle(tc.tokens, tc.bucketing), pods)); got != tc.want {
			t.Errorf("%s, %d tokens, bucketing %v: kept %q, want %q", tc.filter.Name(), tc.tokens, tc.bucketing, got, tc.want)
		}
	}
}

// The standard-deviation skip outside the roleset handler: in-flight counts 0, 0, 0, 12:
// mean 3, sample std √((3·9 + 81)/3) = 6; N = 1 skips counts above 9 (the busy pod), N = 2
// (limit 15) and a negative N (disabled) keep all.
func TestStddevFilter(t *testing.T) {
	c := New(Options{})
	var pods []*pool.Endpoint
	for i := range 4 {
		e := pool.NewEndpoint("ns", string(rune('a'+i)), "10.6.0.2", int32(8000+i), 0, nil, nil)
		pods = append(pods, e)
	}
	for range 12 {
		c.prefill.Start(pods[3].Key())
	}
	for _, tc := range []struct {
		factor float64
		kept   int
	}{{1, 3}, {2, 4}, {-1, 4}} {
		cy := &picker.Cycle{Req: &request.Request{}, State: &picker.CycleState{}}
		cy.Resolved.PD.PrefixCache.StandardDeviationFactor = tc.factor
		f := &StddevFilter{TypedName: picker.NewTypedName(TypeStddevFilter, ""), c: c}
		if got := len(f.Filter(context.Background(), cy, pods)); got != tc.kept {
			t.Errorf("N=%v: kept %d, want %d", tc.factor, got, tc.kept)
		}
	}
}

// A policy scorer's [0, 1] view of the seed's costs, for profiles that mix it with other
// scorers: 1 − cost / max(floor, costs). least_request prefill over in-flight 0, 2, 4:
// max 4 → 1, 0.5, 0.
func TestPolicyScorerView(t *testing.T) {
	c := New(Options{})
	var pods []*pool.Endpoint
	for i := range 3 {
		pods = append(pods, pool.NewEndpoint("ns", string(rune('p'+i)), "10.6.0.3", int32(8000+i), 0, nil, nil))
	}
	for i, n := range []int{0, 2, 4} {
		for range n {
			c.prefill.Start(pods[i].Key())
		}
	}
	cy := &picker.Cycle{Req: &request.Request{}, State: &picker.CycleState{}}
	cy.Resolved.PD = config.DefaultPD()
	cy.Resolved.Routing.PrefillScorePolicy = PolicyLeastRequest
	out := make([]float64, 3)
	c.NewPrefillPolicyScorer("").Score(context.Background(), cy, pods, out)
	if out[0] != 1 || out[1] != 0.5 || out[2] != 0 {
		t.Fatalf("prefill view %v, want [1 0.5 0]", out)
	}
	// Decode least_request over pending 0 and 3 (no running counts: no cold start): max 3.
	for range 3 {
		c.pending.Start(pods[1].Key())
	}
	cy = &picker.Cycle{Req: &request.Request{}, State: &picker.CycleState{}}
	cy.Resolved.PD = config.DefaultPD()
	cy.Resolved.Routing.DecodeScorePolicy = PolicyLeastRequest
	out = make([]float64, 2)
	c.NewDecodePolicyScorer("").Score(context.Background(), cy, pods[:2], out)
	if out[0] != 1 || out[1] != 0 {
		t.Fatalf("decode view %v, want [1 0]", out)
	}
}
