// Package traces holds the real request traces that the demo, the tests and bench/quality
// replay, embedded so that they travel with the repository (and with every binary built from
// it): a clone needs nothing beside it. README.md gives each file's source, licence and
// attribution. It only carries data; it must not parse or interpret it.
package traces

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// The trace files. A directory given with -data (demo, bench/quality) must hold files of these
// names in the same formats.
const (
	AzureConv = "azure-llm-2023-conv.csv"  // TIMESTAMP,ContextTokens,GeneratedTokens; chat
	AzureCode = "azure-llm-2023-code.csv"  // TIMESTAMP,ContextTokens,GeneratedTokens; code completion
	Mooncake  = "mooncake-synthetic.jsonl" // {"timestamp" ms, "input_length", "output_length", "hash_ids"}
)

// Files are the names of every embedded trace.
var Files = []string{AzureConv, AzureCode, Mooncake}

// embedded is the traces as they are in this directory, whole and unchanged.
//
//go:embed azure-llm-2023-conv.csv azure-llm-2023-code.csv mooncake-synthetic.jsonl
var embedded embed.FS

// Embedded returns the traces shipped with the repository.
func Embedded() fs.FS { return embedded }

// Open returns the traces to read: the embedded ones when dir is "", else the directory dir,
// which must hold every file in need (checked now, so a wrong -data fails before anything slow).
func Open(dir string, need ...string) (fs.FS, error) {
	if dir == "" {
		return embedded, nil
	}
	var missing []error
	for _, name := range need {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			missing = append(missing, err)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("trace directory %s: %w (it must hold %v, in the formats of traces/README.md; leave -data unset to use the traces shipped in the repository)",
			dir, errors.Join(missing...), need)
	}
	return os.DirFS(dir), nil
}
