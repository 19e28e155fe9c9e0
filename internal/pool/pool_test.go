package pool

import (
	"testing"
)

func TestClassify(t *testing.T) {
	cases := []struct {
		labels  map[string]string
		role    Role
		roleset string
		engine  string
	}{
		{map[string]string{"role-name": "prefill", "roleset-name": "g0"}, RolePrefill, "g0", EngineVLLM},
		{map[string]string{"role-name": "decode", "roleset-name": "g0", "model.aibrix.ai/engine": "sglang"}, RoleDecode, "g0", EngineSGLang},
		{map[string]string{"role-name": "all", "roleset-name": "g0"}, RoleStandard, "g0", EngineVLLM},
		{map[string]string{}, RoleStandard, "", EngineVLLM},
		// llm-d's label when role-name is absent; role-name wins when both are set.
		{map[string]string{"llm-d.ai/role": "prefill"}, RolePrefill, "", EngineVLLM},
		{map[string]string{"llm-d.ai/role": "decode"}, RoleDecode, "", EngineVLLM},
		{map[string]string{"llm-d.ai/role": "prefill-decode"}, RoleStandard, "", EngineVLLM},
		{map[string]string{"llm-d.ai/role": "both"}, RoleStandard, "", EngineVLLM},
		{map[string]string{"llm-d.ai/role": "decode", "role-name": "prefill"}, RolePrefill, "", EngineVLLM},
		{map[string]string{"model.aibrix.ai/engine": "trtllm"}, RoleStandard, "", EngineTRTLLM},
	}
	for _, tc := range cases {
		role, rs, eng := Classify(tc.labels)
		if role != tc.role || rs != tc.roleset || eng != tc.engine {
			t.Errorf("%v: got %s/%q/%s, want %s/%q/%s", tc.labels, role, rs, eng, tc.role, tc.roleset, tc.engine)
		}
	}
}

// The role label in force: role-name when set and not empty, else llm-d.ai/role; a pod
// declares llm-d's routing sidecar by carrying llm-d.ai/role, whatever role-name says.
func TestRoleLabelAndRoutingSidecar(t *testing.T) {
	cases := []struct {
		name       string
		labels     map[string]string
		key, value string
		sidecar    bool
	}{
		{"no role label", map[string]string{}, LabelLLMDRole, "", false},
		{"role-name only", map[string]string{LabelRoleName: "decode"}, LabelRoleName, "decode", false},
		{"llm-d only", map[string]string{LabelLLMDRole: "prefill-decode"}, LabelLLMDRole, "prefill-decode", true},
		{"both: role-name wins", map[string]string{LabelRoleName: "prefill", LabelLLMDRole: "decode"}, LabelRoleName, "prefill", true},
		{"empty role-name: llm-d's", map[string]string{LabelRoleName: "", LabelLLMDRole: "decode"}, LabelLLMDRole, "decode", true},
		{"empty llm-d label", map[string]string{LabelLLMDRole: ""}, LabelLLMDRole, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if k, v := RoleLabel(tc.labels); k != tc.key || v != tc.value {
				t.Errorf("RoleLabel: %s=%q, want %s=%q", k, v, tc.key, tc.value)
			}
			if got := NewEndpoint("ns", "p", "10.0.0.1", 8000, 0, tc.labels, nil).RoutingSidecar(); got != tc.sidecar {
				t.Errorf("RoutingSidecar %v, want %v", got, tc.sidecar)
			}
		})
	}
}

func TestStorePublishAndLookups(t *testing.T) {
	s := NewStore()
	if snap := s.Load(); snap.Synced || len(snap.Endpoints) != 0 {
		t.Fatalf("new store: %+v", snap)
	}
	changes := s.Changes()
	a := NewEndpoint("ns", "b", "10.0.0.2", 8000, 0, nil, nil)
	b0 := NewEndpoint("ns", "a", "10.0.0.1", 8000, 0, nil, nil)
	b1 := NewEndpoint("ns", "a", "10.0.0.1", 8002, 1, nil, nil)
	snap := s.Publish(Info{Name: "p"}, []*Endpoint{a, b1, b0}, true)
	select {
	case <-changes:
	default:
		t.Fatal("Publish did not signal Changes")
	}
	if !snap.Synced || snap.Version != 1 || s.Load() != snap {
		t.Fatalf("snapshot %+v", snap)
	}
	if got := []string{snap.Endpoints[0].Key(), snap.Endpoints[1].Key(), snap.Endpoints[2].Key()}; got[0] != "ns/a:8000" || got[1] != "ns/a:8002" || got[2] != "ns/b:8000" {
		t.Fatalf("not sorted by key: %v", got)
	}
	if e, ok := snap.ByHostPort("10.0.0.1:8002"); !ok || e != b1 {
		t.Fatalf("ByHostPort: %v %v", e, ok)
	}
	for key, want := range map[string]bool{"ns/a:8000": true, "ns/a:8002": true, "ns/b:8000": true, "ns/a:8001": false, "ns/0": false, "ns/c:8000": false, "": false} {
		if got := snap.Has(key); got != want {
			t.Errorf("Has(%q) = %v, want %v", key, got, want)
		}
		if e, ok := snap.ByKey(key); ok != want || (ok && e.Key() != key) || (!ok && e != nil) {
			t.Errorf("ByKey(%q) = %v %v, want the endpoint: %v", key, e, ok, want)
		}
	}
	if e, _ := snap.ByKey("ns/a:8002"); e != b1 {
		t.Errorf("ByKey(ns/a:8002) = %v, want the endpoint published", e)
	}
	if got := snap.ByAddress("10.0.0.1"); len(got) != 2 {
		t.Fatalf("ByAddress: %d endpoints, want 2 ranks", len(got))
	}
	if b1.PodKey() != "ns/a" || b1.HostPort() != "10.0.0.1:8002" || b1.Rank != 1 {
		t.Fatalf("endpoint fields: %s %s %d", b1.PodKey(), b1.HostPort(), b1.Rank)
	}
	if e := NewEndpoint("ns", "v6", "fd00::1", 8000, 0, nil, nil); e.HostPort() != "[fd00::1]:8000" {
		t.Fatalf("IPv6 host:port %q", e.HostPort())
	}
}
