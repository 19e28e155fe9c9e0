package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The built gateway: -h is a success, a mistyped flag is one line naming it, exit 2.
func TestCommandLine(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-epp string") {
		t.Errorf("gateway --help: %v, output:\n%s", err, out)
	}
	for _, args := range [][]string{{"--lisen", "127.0.0.1:0"}, {"extra"}} {
		out, err = exec.Command(bin, args...).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("gateway %q: %v, want exit status 2", args, err)
		}
		if lines := strings.Count(string(out), "\n"); lines != 1 || !strings.Contains(string(out), "gateway -h lists the flags") {
			t.Errorf("gateway %q printed %d lines, want one naming the mistake:\n%s", args, lines, out)
		}
	}
}
