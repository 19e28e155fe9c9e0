package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite "+ReferencePath+" from the code")

// TestReferenceIsCurrent fails when docs/configuration.md and the definitions in this package
// disagree. Regenerate with: go generate ./internal/config
func TestReferenceIsCurrent(t *testing.T) {
	path := filepath.Join("..", "..", filepath.FromSlash(ReferencePath))
	want := Reference()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v; generate it with: go generate ./internal/config", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is out of date with internal/config; regenerate it with: go generate ./internal/config", ReferencePath)
	}
}

// The reference must mention every setting, field, label and header by name.
func TestReferenceListsEverything(t *testing.T) {
	doc := string(Reference())
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

const (
	readmeStart = "<!-- configuration-reference:start -->"
	readmeEnd   = "<!-- configuration-reference:end -->"
)

// readmeSection is the reference as the README embeds it: from the gateway settings on, one
// heading level down (the README's own "Configuration reference" section holds it).
func readmeSection() string {
	ref := string(Reference())
	ref = ref[strings.Index(ref, "## Gateway settings"):]
	var b strings.Builder
	for _, line := range strings.SplitAfter(ref, "\n") {
		if strings.HasPrefix(line, "#") {
			b.WriteString("#")
		}
		b.WriteString(line)
	}
	return b.String()
}

// TestReadmeEmbedsReference fails when the README's configuration tables drift from the code.
// Regenerate with: go generate ./internal/config
func TestReadmeEmbedsReference(t *testing.T) {
	path := filepath.Join("..", "..", "README.md")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, readmeStart), strings.Index(doc, readmeEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the %s … %s markers", readmeStart, readmeEnd)
	}
	want := "\n" + readmeSection()
	if *update {
		doc = doc[:i+len(readmeStart)] + want + doc[j:]
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if doc[i+len(readmeStart):j] != want {
		t.Fatal("README.md's configuration reference is out of date with internal/config; regenerate it with: go generate ./internal/config")
	}
}
