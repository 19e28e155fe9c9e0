package conformance_test

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeRulesHaveTests: every row of README.md's v1.6 rule table names a test that exists
// (or says why none applies), so the table cannot drift from the suites.
func TestReadmeRulesHaveTests(t *testing.T) {
	f, err := os.Open("README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defined := map[string]bool{}
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range regexp.MustCompile(`(?m)^func (Test\w+)\(`).FindAllSubmatch(src, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	testName := regexp.MustCompile("`(Test\\w+)[/`]")
	row := regexp.MustCompile(`^\| (\d+) \|`)
	rows := 0
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.Contains(line, "v1.6.0: every rule")
			continue
		}
		m := row.FindStringSubmatch(line)
		if !in || m == nil {
			continue
		}
		rows++
		cells := strings.Split(line, "|")
		last := strings.TrimSpace(cells[len(cells)-2])
		names := testName.FindAllStringSubmatch(last, -1)
		if len(names) == 0 && last != "—" && !strings.Contains(last, "tests") && !strings.HasPrefix(last, "every ") {
			t.Errorf("rule %s names no test: %q", m[1], last)
		}
		for _, n := range names {
			if !defined[n[1]] {
				t.Errorf("rule %s names %s, which no test file defines", m[1], n[1])
			}
		}
	}
	if rows < 20 {
		t.Errorf("the v1.6 table has %d rows; expected the full list", rows)
	}
}
