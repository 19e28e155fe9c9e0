package version

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	bi := func(main string, settings ...string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			b := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: main}}
			for i := 0; i+1 < len(settings); i += 2 {
				b.Settings = append(b.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
			}
			return b, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	cases := []struct {
		name, v, c string
		info       func() (*debug.BuildInfo, bool)
		want       string
	}{
		{"stamped wins", "v1.2.3", "abc", bi("v9.9.9", "vcs.revision", "def"), "v1.2.3 (commit abc, go1.99.1, "},
		{"go install @version", "", "", bi("v0.4.0"), "v0.4.0 (commit unknown, go1.99.1, "},
		{"go build in a checkout", "", "", bi("(devel)", "vcs.revision", "def", "vcs.modified", "true"), "devel (commit def-dirty, go1.99.1, "},
		{"nothing recorded", "", "", none, "devel (commit unknown, " + runtime.Version() + ", "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := resolve(c.v, c.c, c.info).String()
			end := runtime.GOOS + "/" + runtime.GOARCH + ")"
			if c.v == "" && c.c == "" && c.name == "nothing recorded" {
				end += "; not stamped: go run records no version or commit, make build (or go build in a git checkout) does"
			}
			if !strings.HasPrefix(got, c.want) || !strings.HasSuffix(got, end) {
				t.Errorf("got %q, want it to start with %q and end with the platform", got, c.want)
			}
		})
	}
}

// TestLDFlagsStampABuild builds a program with LDFlags and runs it: the -X paths are right.
func TestLDFlagsStampABuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "probe")
	cmd := exec.Command("go", "build", "-ldflags", LDFlags("v7.8.9-test", "0123abcd"), "-o", bin, "./testdata/probe")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd, err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "probe v7.8.9-test (commit 0123abcd, " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"; string(out) != want {
		t.Errorf("stamped build prints %q, want %q", out, want)
	}
}
