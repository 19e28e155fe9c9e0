package podports

import (
	"fmt"
	"reflect"
	"testing"
)

func TestEndpoints(t *testing.T) {
	cases := []struct {
		name        string
		targetPorts []int32
		labels      map[string]string
		annotations map[string]string
		want        []string // "port/rank"
		warn        string   // substring of the only warning, "" for none
	}{
		{name: "single port", targetPorts: []int32{8000}, want: []string{"8000/0"}},
		{name: "three ranks", targetPorts: []int32{3000, 3002, 3004}, want: []string{"3000/0", "3002/1", "3004/2"}},
		{name: "active-ports keeps rank of the port", targetPorts: []int32{3000, 3002, 3004},
			annotations: map[string]string{"inference.networking.k8s.io/active-ports": "3004, 3000"},
			want:        []string{"3000/0", "3004/2"}},
		{name: "llm-d name when GIE name absent", targetPorts: []int32{3000, 3002},
			annotations: map[string]string{"llm-d.ai/active-ports": "3002"}, want: []string{"3002/1"}},
		{name: "GIE name wins over llm-d name", targetPorts: []int32{3000, 3002},
			annotations: map[string]string{"inference.networking.k8s.io/active-ports": "3000", "llm-d.ai/active-ports": "3002"},
			want:        []string{"3000/0"}},
		{name: "active port that is not a target port is ignored", targetPorts: []int32{3000},
			annotations: map[string]string{"inference.networking.k8s.io/active-ports": "9999"}, want: []string{}},
		{name: "empty annotation means no live port", targetPorts: []int32{3000},
			annotations: map[string]string{"inference.networking.k8s.io/active-ports": ""}, want: []string{}},
		{name: "bad entry warns, others count", targetPorts: []int32{3000, 3002},
			annotations: map[string]string{"inference.networking.k8s.io/active-ports": "x,3002"},
			want:        []string{"3002/1"}, warn: `annotations["inference.networking.k8s.io/active-ports"]="x,3002": "x" is not a port number; entry ignored`},
		{name: "port label overrides a single target port", targetPorts: []int32{8000},
			labels: map[string]string{"model.aibrix.ai/port": "8100"}, want: []string{"8100/0"}},
		{name: "port label ignored with several target ports", targetPorts: []int32{8000, 8001},
			labels: map[string]string{"model.aibrix.ai/port": "8100"}, want: []string{"8000/0", "8001/1"}},
		{name: "bad port label warns and keeps target port", targetPorts: []int32{8000},
			labels: map[string]string{"model.aibrix.ai/port": "70000"}, want: []string{"8000/0"},
			warn: `labels["model.aibrix.ai/port"]="70000": 70000 is out of range 1-65535; using target port 8000`},
		{name: "no target ports, no endpoints", want: []string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eps, warnings := Endpoints("ns", "pod", "10.0.0.1", tc.targetPorts, tc.labels, tc.annotations, nil)
			got := []string{}
			for _, e := range eps {
				got = append(got, fmt.Sprintf("%d/%d", e.Port, e.Rank))
				if e.Address != "10.0.0.1" || e.PodKey() != "ns/pod" {
					t.Errorf("endpoint %s has address %s", e.Key(), e.Address)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ports/ranks = %v, want %v", got, tc.want)
			}
			switch {
			case tc.warn == "" && len(warnings) != 0:
				t.Errorf("unexpected warnings %q", warnings)
			case tc.warn != "" && (len(warnings) != 1 || warnings[0].String() != tc.warn):
				t.Errorf("warnings = %q, want one containing %q", warnings, tc.warn)
			}
		})
	}
}
