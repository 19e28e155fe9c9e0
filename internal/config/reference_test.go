package config_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pd"
)

// reference is the reference of this build: every plugin type the binary registers.
func reference() []byte { return config.Reference(pd.NewRegistry(nil).Docs()) }

var update = flag.Bool("update", false, "rewrite "+config.ReferencePath+" from the code")

// TestReferenceIsCurrent fails when docs/configuration.md and the definitions in this package
// disagree. Regenerate with: go generate ./internal/config
func TestReferenceIsCurrent(t *testing.T) {
	path := filepath.Join("..", "..", filepath.FromSlash(config.ReferencePath))
	want := reference()
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
		t.Fatalf("%s is out of date with internal/config; regenerate it with: go generate ./internal/config", config.ReferencePath)
	}
}

// Every plugin type the build registers is in the reference, with each of its parameters.
func TestReferenceListsEveryPluginType(t *testing.T) {
	doc := string(reference())
	docs := pd.NewRegistry(nil).Docs()
	if len(docs) < 20 {
		t.Fatalf("%d plugin types registered", len(docs))
	}
	for _, d := range docs {
		if !strings.Contains(doc, "| `"+d.Type+"` | "+d.Kind+" |") {
			t.Errorf("the reference does not list plugin type %s", d.Type)
		}
		for _, p := range d.Params {
			if !strings.Contains(doc, "| `"+d.Type+"` | `"+p.Name+"` |") {
				t.Errorf("the reference does not list %s's parameter %s", d.Type, p.Name)
			}
		}
	}
}
