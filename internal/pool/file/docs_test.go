package file

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

var (
	docPath     = filepath.Join("..", "..", "..", "docs", "pool-file.md")
	examplePath = filepath.Join("..", "..", "..", "examples", "pool.yaml")
)

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the lines of the markdown section headed "## title" (up to the next "## ").
func section(t *testing.T, doc, title string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n## "+title+"\n")
	if !ok {
		t.Fatalf("docs/pool-file.md has no section %q", title)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return strings.Split(rest, "\n")
}

// firstCell returns the code span of each table row's first cell (“a`b“ or `a`).
func firstCells(lines []string) []string {
	cell := regexp.MustCompile("^\\| (``(.+?)``|`([^`]+)`) \\|")
	var out []string
	for _, l := range lines {
		if m := cell.FindStringSubmatch(l); m != nil {
			out = append(out, m[2]+m[3])
		}
	}
	return out
}

// TestExampleIsShippedAndLoads: examples/pool.yaml loads, gives the endpoints its comments
// promise, and is the example printed in docs/pool-file.md.
func TestExampleIsShippedAndLoads(t *testing.T) {
	info, eps, err := Load(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range eps {
		got = append(got, fmt.Sprintf("%s %s %s/%s %s", e.Key(), e.HostPort(), e.Role, e.Roleset, e.Model))
	}
	want := []string{
		"default/vllm-prefill-0:8100 127.0.0.1:8100 prefill/group-0 my-model",
		"default/vllm-decode-0:8200 127.0.0.1:8200 decode/group-0 my-model",
		"default/vllm-standard-0:8300 127.0.0.1:8300 standard/ my-model",
	}
	if info.Name != "my-pool" || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("pool %q endpoints:\n%s\nwant my-pool and:\n%s", info.Name, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	raw, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	doc := readDoc(t)
	if !strings.Contains(doc, "<!-- example:start -->\n```yaml\n"+string(raw)+"```\n<!-- example:end -->") {
		t.Error("the example in docs/pool-file.md is not examples/pool.yaml verbatim; copy the file between the example markers")
	}
}

// TestDocumentedFieldsAreTheParsersFields: the fields table lists exactly what the parser accepts.
func TestDocumentedFieldsAreTheParsersFields(t *testing.T) {
	want := append([]string{}, TopFields...)
	for _, f := range PoolFields {
		want = append(want, "pool."+f)
	}
	for _, f := range EndpointFields {
		want = append(want, "endpoints[]."+f)
	}
	for _, f := range ObjectiveFields {
		want = append(want, "objectives[]."+f)
	}
	got := firstCells(section(t, readDoc(t), "Fields"))
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("documented fields %v\nparser's fields    %v", got, want)
	}
}

// TestDocumentedErrorsAreTheParsersErrors: every line of every error in TestParseErrors matches
// a documented pattern, and every documented pattern is produced by at least one of them.
func TestDocumentedErrorsAreTheParsersErrors(t *testing.T) {
	patterns := firstCells(section(t, readDoc(t), "Errors"))
	if len(patterns) < 20 {
		t.Fatalf("only %d documented errors", len(patterns))
	}
	placeholder := regexp.MustCompile(`<[^>]+>|…`)
	res := make([]*regexp.Regexp, len(patterns))
	for i, p := range patterns {
		var b strings.Builder
		last := 0
		for _, loc := range placeholder.FindAllStringIndex(p, -1) {
			b.WriteString(regexp.QuoteMeta(p[last:loc[0]]))
			b.WriteString(".+")
			last = loc[1]
		}
		b.WriteString(regexp.QuoteMeta(p[last:]))
		res[i] = regexp.MustCompile("^" + b.String() + "$")
	}
	used := make([]bool, len(patterns))
	for _, tc := range parseErrorCases {
		for _, line := range strings.Split(tc.want, "\n") {
			matched := false
			for i, re := range res {
				if re.MatchString(line) {
					matched, used[i] = true, true
				}
			}
			if !matched {
				t.Errorf("%s: the error %q matches no row of docs/pool-file.md's Errors table", tc.name, line)
			}
		}
	}
	for i, u := range used {
		if !u {
			t.Errorf("documented error %q is produced by no case of TestParseErrors", patterns[i])
		}
	}
}
