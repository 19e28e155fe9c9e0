package pd

import (
	"testing"

	"github.com/tandem-epp/tandem/internal/bucketserve"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// The adaptive plan's replica share of a roleset counts its distinct prefill pods
// (namespace/name): the ports of one pod count once, equal names in two namespaces twice.
// Candidates come sorted by key, so ns1/p and ns2/p of one roleset sit next to each other.
func TestRolesetGroupsCountPodsByNamespaceAndName(t *testing.T) {
	ep := func(ns, name, role string, port int32) *pool.Endpoint {
		return pool.NewEndpoint(ns, name, "10.0.0.1", port, 0, map[string]string{
			pool.LabelModelName: "m", pool.LabelRoleName: role, pool.LabelRolesetName: "A"}, nil)
	}
	cases := []struct {
		name string
		eps  []*pool.Endpoint
		want int
	}{
		{"one pod, two ports: 1", []*pool.Endpoint{ep("ns1", "d", "decode", 8000), ep("ns1", "p", "prefill", 8000), ep("ns1", "p", "prefill", 8001)}, 1},
		{"same name in two namespaces: 2", []*pool.Endpoint{ep("ns1", "d", "decode", 8000), ep("ns1", "p", "prefill", 8000), ep("ns2", "p", "prefill", 8000)}, 2},
		{"two pods: 2", []*pool.Endpoint{ep("ns1", "d", "decode", 8000), ep("ns1", "p", "prefill", 8000), ep("ns1", "q", "prefill", 8000)}, 2},
	}
	for _, tc := range cases {
		gs := rolesetGroups(&picker.Cycle{Candidates: tc.eps})
		if len(gs) != 1 || gs[0].Replicas != tc.want || gs[0].Max != bucketserve.Unlimited {
			t.Errorf("%s: groups %+v, want one roleset A with %d replicas", tc.name, gs, tc.want)
		}
	}
}
