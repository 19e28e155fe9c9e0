package config

import (
	"strings"
	"testing"
)

// The reference must mention every setting, field, label and header by name.
func TestReferenceListsEverything(t *testing.T) {
	doc := string(Reference(nil))
	var names []string
	for _, v := range Vars {
		names = append(names, "`"+v.Name+"`", "`"+v.Key+"`")
		if v.ProfileKey != "" {
			names = append(names, "`"+v.ProfileKey+"`")
		}
	}
	for _, f := range rcFields {
		names = append(names, "`"+f.Key+"`")
	}
	for k := range pdOverrideFields {
		names = append(names, "`"+k+"`")
	}
	for _, l := range labelDocs {
		names = append(names, "`"+l.Name+"`")
	}
	for _, h := range headerDocs {
		names = append(names, "`"+h.Name+"`")
	}
	for _, want := range []string{"role-name", "roleset-name", "llm-d.ai/role", "model.aibrix.ai/name", "model.aibrix.ai/port",
		"model.aibrix.ai/engine", "model.aibrix.ai/kv-connector-type", "model.aibrix.ai/sglang-bootstrap-port",
		"routing-strategy", "config-profile", "x-aibrix-session-key", "x-gateway-destination-endpoint", "x-prefiller-host-port",
		"test-epp-endpoint-selection", "x-conformance-test-served-endpoint", "x-error-routing", "x-error-pd-prefill",
		"x-error-pd-decode", "x-tandem-trace"} {
		names = append(names, "`"+want+"`")
	}
	for _, n := range names {
		if !strings.Contains(doc, n) {
			t.Errorf("reference does not mention %s", n)
		}
	}
}

func TestReferenceExampleFileParses(t *testing.T) {
	f, err := ParseFile("example.yaml", []byte(exampleFile), FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g, _, err := Load(f, nil)
	if err != nil || !g.PD.PromptLengthBucketing || g.PD.TokenLoadKVWeight != 0.5 || len(f.SchedulingProfiles[0].Plugins) != 3 {
		t.Fatalf("%v %+v", err, f)
	}
}
