package traces

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestReadmeDescribesTheFiles: every embedded file has a README row whose request count, size
// and hash are the file's, so a replaced trace cannot go undocumented.
func TestReadmeDescribesTheFiles(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\| (\\d+) \\| (\\d+) \\| `([0-9a-f]{64})` \\|")
	rows := map[string][]string{}
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		rows[m[1]] = m[2:]
	}
	if len(rows) != len(Files) {
		t.Errorf("README rows for %d files, want %d (%v)", len(rows), len(Files), Files)
	}
	for _, name := range Files {
		data, err := fs.ReadFile(Embedded(), name)
		if err != nil {
			t.Fatal(err)
		}
		r, ok := rows[name]
		if !ok {
			t.Errorf("README has no row for %s", name)
			continue
		}
		sum := sha256.Sum256(data)
		requests := bytes.Count(bytes.TrimRight(data, "\n"), []byte("\n")) + 1
		if strings.HasSuffix(name, ".csv") {
			requests-- // the header
		}
		if want := []string{strconv.Itoa(requests), strconv.Itoa(len(data)), hex.EncodeToString(sum[:])}; strings.Join(r, " ") != strings.Join(want, " ") {
			t.Errorf("README row of %s says requests, bytes, sha256 = %v; the file has %v", name, r, want)
		}
	}
}

func TestOpen(t *testing.T) {
	if f, err := Open(""); err != nil || f != Embedded() {
		t.Fatalf("Open(\"\") = %v, %v; want the embedded traces", f, err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, AzureConv), []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Open(dir, AzureConv)
	if err != nil {
		t.Fatal(err)
	}
	if data, err := fs.ReadFile(f, AzureConv); err != nil || !strings.HasPrefix(string(data), "TIMESTAMP") {
		t.Errorf("reading %s from the directory: %q, %v", AzureConv, data, err)
	}
	_, err = Open(dir, AzureConv, Mooncake)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, Mooncake)) || !strings.Contains(err.Error(), "-data") {
		t.Errorf("a directory without %s: err = %v, want it named with a hint about -data", Mooncake, err)
	}
}
