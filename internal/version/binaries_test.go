package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestEveryBinaryAnswersVersion runs `make build` with VERSION and COMMIT set, as a release
// would, and asks every binary in cmd/ for --version.
func TestEveryBinaryAnswersVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary; skipped with -short")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := filepath.Glob(filepath.Join(root, "cmd", "*", "main.go"))
	if err != nil || len(cmds) < 4 {
		t.Fatalf("cmd/*/main.go: %v %v", cmds, err)
	}
	bin := t.TempDir()
	mk := exec.Command("make", "build", "BIN_DIR="+bin, "VERSION=v0.0.0-make-test", "COMMIT=feedface")
	mk.Dir = root
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mk, err, out)
	}
	for _, m := range cmds {
		name := filepath.Base(filepath.Dir(m))
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command(filepath.Join(bin, name), "--version").Output()
			if err != nil {
				t.Fatalf("%s --version: %v", name, err)
			}
			want := name + " v0.0.0-make-test (commit feedface, " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
			if string(out) != want {
				t.Errorf("%s --version = %q, want %q", name, out, want)
			}
		})
	}
	// An unstamped build still answers, from what the toolchain recorded.
	plain := filepath.Join(bin, "epp-plain")
	build := exec.Command("go", "build", "-o", plain, "./cmd/epp")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := exec.Command(plain, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "epp ") || !strings.Contains(string(out), "(commit ") {
		t.Errorf("unstamped epp --version = %q, %v", out, err)
	}
	_ = os.Remove(plain)
}
