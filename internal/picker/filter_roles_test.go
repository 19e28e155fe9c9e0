package picker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

func labelled(name string, labels map[string]string) *pool.Endpoint {
	return pool.NewEndpoint("ns", name, "10.0.0.9", 8000, 0, labels, nil)
}

// The role filters, pod by pod: llm-d's decode-filter and prefill-filter read llm-d.ai/role
// with llm-d's value sets (a pod without the label may decode, not prefill), the seed's
// role-name wins when set; decode-role-filter drops only prefill-only pods.
func TestRoleFilters(t *testing.T) {
	reg := NewRegistry()
	filter := func(typ string) Filter {
		p, err := reg.New(typ, "", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p.(Filter)
	}
	cases := []struct {
		labels                      map[string]string
		decodeRole, decode, prefill bool
	}{
		{nil, true, true, false},
		{map[string]string{"llm-d.ai/role": "decode"}, true, true, false},
		{map[string]string{"llm-d.ai/role": "prefill"}, false, false, true},
		{map[string]string{"llm-d.ai/role": "prefill-decode"}, true, true, true},
		{map[string]string{"llm-d.ai/role": "both"}, true, true, true},
		{map[string]string{"llm-d.ai/role": "encode"}, true, false, false},
		{map[string]string{"llm-d.ai/role": "encode-prefill"}, true, false, true},
		{map[string]string{"llm-d.ai/role": "encode-prefill-decode"}, true, true, true},
		{map[string]string{"role-name": "prefill"}, false, false, true},
		{map[string]string{"role-name": "decode"}, true, true, false},
		{map[string]string{"role-name": "all"}, true, true, false},
		{map[string]string{"role-name": "decode", "llm-d.ai/role": "prefill"}, true, true, false},
	}
	for _, tc := range cases {
		e := labelled("x", tc.labels)
		for typ, want := range map[string]bool{TypeDecodeRoleFilter: tc.decodeRole, TypeDecodeFilter: tc.decode, TypePrefillFilter: tc.prefill} {
			got := len(filter(typ).Filter(context.Background(), &Cycle{}, []*pool.Endpoint{e})) == 1
			if got != want {
				t.Errorf("%s on %v: kept %v, want %v", typ, tc.labels, got, want)
			}
		}
	}
}

// A routing-strategy header never sends a whole request to a prefill-only pod (issue 11):
// with only prefill pods among the candidates, every non-PD strategy answers 503 rather
// than fall back on them.
func TestHeaderStrategiesNeverPickPrefillOnlyPods(t *testing.T) {
	r := newTestRouter(t, NewDeps(nil, config.PrefixCache{}), "")
	snap := snapOf(ep("p1", "prefill", ""), ep("p2", "prefill", ""))
	for _, s := range []string{"random", "least-request", "prefix-cache"} {
		d, err := r.Schedule(context.Background(), parse(t, map[string]string{"routing-strategy": s}, "hi"), snap, snap.Endpoints)
		var ae *apierror.Error
		if !errors.As(err, &ae) || ae.Status != 503 || !strings.Contains(ae.Message, "decode-role-filter") {
			t.Fatalf("%s over prefill-only pods: decision %+v, error %v; want a 503 naming the filter", s, d, err)
		}
	}
}
