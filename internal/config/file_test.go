package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var knownTypes = func(t string) bool {
	switch t {
	case "prefix-cache-scorer", "queue-scorer", "max-score-picker", "pd-profile-handler":
		return true
	}
	return false
}

const goodFile = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  name: prefix
  parameters:
    blockSize: 64
    nested: {a: [1, 2]}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix
    weight: 3
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: max-score-picker
gateway:
  promptLengthBucketing: true
  tokenLoadKVWeight: 0.5
  prefillRequestTimeout: 10
`

func TestParseFileGood(t *testing.T) {
	f, err := ParseFile("epp.yaml", []byte(goodFile), FileOptions{KnownPluginTypes: knownTypes})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Plugins) != 3 || f.Plugins[0].Name != "prefix" || f.Plugins[1].Name != "queue-scorer" || f.Plugins[2].Line != 10 {
		t.Errorf("plugins %+v", f.Plugins)
	}
	if got := string(f.Plugins[0].Parameters); got != `{"blockSize":64,"nested":{"a":[1,2]}}` {
		t.Errorf("parameters %s", got)
	}
	if f.Plugins[1].Parameters != nil {
		t.Errorf("absent parameters should be nil, got %s", f.Plugins[1].Parameters)
	}
	sp := f.SchedulingProfiles
	if len(sp) != 1 || sp[0].Name != "default" || len(sp[0].Plugins) != 3 || *sp[0].Plugins[0].Weight != 3 || sp[0].Plugins[2].Weight != nil || sp[0].Plugins[1].Line != 16 {
		t.Errorf("profiles %+v", sp)
	}
	// file < env: the environment wins over the gateway: section.
	g, _, err := Load(f, envOf(map[string]string{"AIBRIX_TOKEN_LOAD_KV_WEIGHT": "0.7"}))
	if err != nil {
		t.Fatal(err)
	}
	if !g.PD.PromptLengthBucketing || g.PD.TokenLoadKVWeight != 0.7 || g.PD.PrefillRequestTimeout != 10*time.Second {
		t.Errorf("layering: %+v", g.PD)
	}
}

func TestLoadFileFromDisk(t *testing.T) {
	path := filepath.Join(t.TempDir(), "epp.yaml")
	if err := os.WriteFile(path, []byte(goodFile), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(path, FileOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(path+".missing", FileOptions{}); err == nil || !strings.Contains(err.Error(), "--config-file") {
		t.Errorf("missing file: %v", err)
	}
}

// Each case is a file and the exact error lines it must produce.
func TestParseFileErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown top-level field", "plugins: []\nschedulingProfile: []\n",
			[]string{"epp.yaml: unmarshal errors:\n  line 2: field schedulingProfile is not allowed at the top level (allowed: apiVersion, kind, featureGates, plugins, schedulingProfiles, gateway)"}},
		{"unknown plugin field", "plugins:\n- type: queue-scorer\n  params: {}\n",
			[]string{"line 3: field params is not allowed in a plugins entry (allowed: type, name, parameters)"}},
		{"unknown ref field", "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - ref: queue-scorer\n",
			[]string{"line 6: field ref is not allowed in a profile's plugins entry (allowed: pluginRef, weight)"}},
		{"wrong type", "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n    weight: heavy\n",
			[]string{"line 7: cannot unmarshal !!str `heavy` into float64"}},
		{"duplicate key", "plugins: []\nplugins: []\n", []string{"line 2: mapping key \"plugins\" already defined at line 1"}},
		{"bad syntax", "plugins: [\n", []string{"epp.yaml: "}},
		{"two documents", "plugins: []\n---\nplugins: []\n", []string{"epp.yaml: line 2: a config file holds one YAML document"}},
		{"wrong kind", "kind: InferencePool\n", []string{"epp.yaml:1: kind=InferencePool: must be EndpointPickerConfig"}},
		{"unknown plugin type", "plugins:\n- type: queue-scorer\n- type: magic-scorer\n",
			[]string{"epp.yaml:3: plugins[1].type=magic-scorer: is not a registered plugin type"}},
		{"missing type", "plugins:\n- name: x\n", []string{"epp.yaml:2: plugins[0].type=: is required"}},
		{"duplicate name", "plugins:\n- type: queue-scorer\n  name: q\n- type: prefix-cache-scorer\n  name: q\n",
			[]string{"epp.yaml:4: plugins[1].name=q: duplicates the plugin declared at line 2"}},
		{"duplicate default name", "plugins:\n- type: queue-scorer\n- type: queue-scorer\n",
			[]string{"epp.yaml:3: plugins[1].name=queue-scorer: duplicates the plugin declared at line 2"}},
		{"parameters not a mapping", "plugins:\n- type: queue-scorer\n  parameters: [1]\n",
			[]string{"epp.yaml:3: plugins[0].parameters=: must be a mapping"}},
		{"undeclared ref", "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue\n",
			[]string{"epp.yaml:6: schedulingProfiles[0].plugins[0].pluginRef=queue: names no plugin declared under plugins"}},
		{"ref twice", "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: queue-scorer\n",
			[]string{"epp.yaml:7: schedulingProfiles[0].plugins[1].pluginRef=queue-scorer: is listed twice in this profile"}},
		{"negative weight", "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n    weight: -1\n",
			[]string{"epp.yaml:6: schedulingProfiles[0].plugins[0].weight=-1: must be 0 or more"}},
		{"duplicate profile", "schedulingProfiles:\n- name: p\n- name: p\n",
			[]string{"epp.yaml:3: schedulingProfiles[1].name=p: duplicates the profile declared at line 2"}},
		{"unnamed profile", "schedulingProfiles:\n- plugins: []\n", []string{"epp.yaml:2: schedulingProfiles[0].name=: is required"}},
		{"gateway bad value", "gateway:\n  tokenLoadKVWeight: -1\n", []string{"epp.yaml:2: gateway.tokenLoadKVWeight=-1: must be positive"}},
		{"gateway unknown key", "gateway:\n  tokenLoadKvWeight: 1\n",
			[]string{"epp.yaml:2: gateway.tokenLoadKvWeight=: is not a gateway setting; did you mean tokenLoadKVWeight? (the keys are listed in docs/configuration.md)"}},
		{"gateway env name as key", "gateway:\n  AIBRIX_MIN_MATCH_PCT: 10\n",
			[]string{"epp.yaml:2: gateway.AIBRIX_MIN_MATCH_PCT=: is not a gateway setting: AIBRIX_MIN_MATCH_PCT is its environment variable; in the file the key is minMatchPct"}},
		{"unknown key's value not echoed", "gateway:\n  TANDEM_REDIS_PASSWORD: s3cret\n",
			[]string{"epp.yaml:2: gateway.TANDEM_REDIS_PASSWORD=: is not a gateway setting"}},
		{"gateway key misspelt", "gateway:\n  minMatchPc: 10\n",
			[]string{"epp.yaml:2: gateway.minMatchPc=: is not a gateway setting; did you mean minMatchPct?"}},
		{"gateway list value", "gateway:\n  minMatchPct: [1]\n", []string{"epp.yaml:2: gateway.minMatchPct=: needs a single value: must be 0 to 100"}},
		{"gateway not a mapping", "gateway: 3\n", []string{"epp.yaml:1: gateway=3: must be a mapping of setting: value"}},
		{"all at once", "plugins:\n- type: nope\ngateway:\n  trtMachineID: 1024\n  minMatchPct: -1\n",
			[]string{"3 configuration problems:",
				"  epp.yaml:2: plugins[0].type=nope: is not a registered plugin type",
				"  epp.yaml:4: gateway.trtMachineID=1024: must be in [0, 1024)",
				"  epp.yaml:5: gateway.minMatchPct=-1: must be 0 to 100"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseFile("epp.yaml", []byte(c.yaml), FileOptions{KnownPluginTypes: knownTypes})
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not contain\n%s", err, w)
				}
			}
		})
	}
}

func TestParseFileEmptyAndKeepDefault(t *testing.T) {
	f, err := ParseFile("empty.yaml", nil, FileOptions{})
	if err != nil || len(f.Plugins) != 0 {
		t.Fatalf("empty file: %v %+v", err, f)
	}
	f, err = ParseFile("epp.yaml", []byte("gateway:\n  bucketServeMode: latency\n"), FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g, warns, err := Load(f, nil)
	if err != nil || g.PD.BucketServeMode != "throughput" || len(warns) != 1 || warns[0].Field != "gateway.bucketServeMode" {
		t.Fatalf("%v %v %q", err, warns, g.PD.BucketServeMode)
	}
	// The cross-field rule sees the merged result: bucketServe from the file, bucketing from env.
	f, _ = ParseFile("epp.yaml", []byte("gateway:\n  bucketServe: true\n"), FileOptions{})
	if _, _, err := Load(f, envOf(nil)); err == nil || !strings.Contains(err.Error(), "requires AIBRIX_PROMPT_LENGTH_BUCKETING=true") {
		t.Errorf("cross-field: %v", err)
	}
	if _, _, err := Load(f, envOf(map[string]string{"AIBRIX_PROMPT_LENGTH_BUCKETING": "true"})); err != nil {
		t.Errorf("bucketing from env should satisfy the file's bucketServe: %v", err)
	}
}
