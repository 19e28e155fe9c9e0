// Package lib_test runs hack/lib/cache.sh, the lock-and-rename that every hack/ensure-*.sh
// caching a tool outside the clone goes through, with several runs at once.
package lib_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// script is an ensure-*.sh in miniature: its build logs a line, announces itself in $dir.started,
// waits for the test to create $RELEASE, and writes the tool (or fails if FAIL is set).
const script = `set -euo pipefail
source ./cache.sh
dir=$1
build_tool() {
  echo "build $$" >> "$LOG"
  touch "$STARTED"
  while [[ ! -e "$RELEASE" ]]; do sleep 0.02; done
  [[ -z "${FAIL:-}" ]] || return 1
  printf '#!/bin/sh\necho tool\n' > "$1/tool"
  chmod +x "$1/tool"
}
cache_build "$dir" build_tool tool
echo "$dir/tool"
`

type env struct {
	t                              *testing.T
	dir, log, started, release, sh string
}

func newEnv(t *testing.T) *env {
	tmp := t.TempDir()
	e := &env{t: t, dir: filepath.Join(tmp, "cache", "tools", "tool-v1"), log: filepath.Join(tmp, "log"),
		started: filepath.Join(tmp, "started"), release: filepath.Join(tmp, "release"), sh: filepath.Join(tmp, "ensure.sh")}
	if err := os.WriteFile(e.sh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) start(extra ...string) (*exec.Cmd, *bytes.Buffer, *syncBuffer) {
	cmd := exec.Command("bash", e.sh, e.dir)
	cmd.Dir = "." // hack/lib, where cache.sh is
	cmd.Env = append(os.Environ(), "LOG="+e.log, "STARTED="+e.started, "RELEASE="+e.release)
	cmd.Env = append(cmd.Env, extra...)
	var out bytes.Buffer
	errb := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = &out, errb
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	return cmd, &out, errb
}

// waitFor polls cond (a file or output appearing) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// leftovers lists what sits next to the cache directory besides it and its lock.
func (e *env) leftovers() []string {
	entries, _ := os.ReadDir(filepath.Dir(e.dir))
	var names []string
	for _, en := range entries {
		if n := en.Name(); n != filepath.Base(e.dir) && n != filepath.Base(e.dir)+".lock" {
			names = append(names, n)
		}
	}
	return names
}

func TestTwoRunsAtOnceBuildOnceAndBothGetTheTool(t *testing.T) {
	e := newEnv(t)
	first, out1, _ := e.start()
	waitFor(t, "the first run to start building", func() bool { return exists(e.started) })
	second, out2, err2 := e.start()
	waitFor(t, "the second run to wait for the lock", func() bool { return strings.Contains(err2.String(), "waiting for another run") })
	if exists(e.dir) {
		t.Fatalf("%s exists while its build is still running", e.dir)
	}
	if err := os.WriteFile(e.release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, c := range []*exec.Cmd{first, second} {
		if err := c.Wait(); err != nil {
			t.Fatalf("run %d: %v", i+1, err)
		}
	}
	want := e.dir + "/tool\n"
	if out1.String() != want || out2.String() != want {
		t.Errorf("runs printed %q and %q, want %q each", out1, out2, want)
	}
	if b, _ := os.ReadFile(e.log); strings.Count(string(b), "build") != 1 {
		t.Errorf("the tool was built %d times, want once:\n%s", strings.Count(string(b), "build"), b)
	}
	if out, err := exec.Command(filepath.Join(e.dir, "tool")).Output(); err != nil || string(out) != "tool\n" {
		t.Errorf("cached tool: %q, %v", out, err)
	}
	if l := e.leftovers(); len(l) != 0 {
		t.Errorf("left next to the cache: %v", l)
	}
}

func TestACompleteCacheIsUsedWithoutBuilding(t *testing.T) {
	e := newEnv(t)
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.dir, "tool"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, out, _ := e.start()
	if err := c.Wait(); err != nil || out.String() != e.dir+"/tool\n" {
		t.Fatalf("run: %v, printed %q", err, out)
	}
	if exists(e.log) {
		t.Error("a complete cache was rebuilt")
	}
}

func TestAnIncompleteCacheIsReplacedAndAFailedBuildLeavesNothing(t *testing.T) {
	e := newEnv(t)
	if err := os.MkdirAll(e.dir, 0o755); err != nil { // a half-built directory, no tool in it
		t.Fatal(err)
	}
	if err := os.WriteFile(e.release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c, _, errb := e.start("FAIL=1")
	if err := c.Wait(); err == nil {
		t.Fatal("a failed build exited 0")
	}
	if !strings.Contains(errb.String(), "building "+e.dir+" failed") {
		t.Errorf("stderr does not name the failed build: %q", errb)
	}
	if l := e.leftovers(); len(l) != 0 {
		t.Errorf("a failed build left %v", l)
	}
	c, out, _ := e.start()
	if err := c.Wait(); err != nil || out.String() != e.dir+"/tool\n" {
		t.Fatalf("rebuild: %v, printed %q", err, out)
	}
	if !exists(filepath.Join(e.dir, "tool")) {
		t.Error("the incomplete cache was not replaced by a complete one")
	}
	if l := e.leftovers(); len(l) != 0 {
		t.Errorf("left next to the cache: %v", l)
	}
}
