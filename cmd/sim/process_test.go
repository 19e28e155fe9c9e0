package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestProcess builds the binary and runs it as a real process: SIGTERM stops it cleanly, a
// crash ends it with status 3.
func TestProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "sim")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, c := range []struct {
		name     string
		stop     func(cmd *exec.Cmd, pod podLine) error
		wantCode int
	}{
		{"sigterm", func(cmd *exec.Cmd, _ podLine) error { return cmd.Process.Signal(syscall.SIGTERM) }, 0},
		{"crash", func(_ *exec.Cmd, pod podLine) error {
			resp, err := http.Post(pod.URL+"/sim/crash", "", nil)
			if err == nil {
				resp.Body.Close()
			}
			return err
		}, 3},
	} {
		cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-engine", "trtllm", "-role", "prefill", "-time-scale", "0.01")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		timer := time.AfterFunc(20*time.Second, func() { _ = cmd.Process.Kill() })
		var pod podLine
		sc := bufio.NewScanner(stdout)
		if !sc.Scan() || json.Unmarshal(sc.Bytes(), &pod) != nil {
			t.Fatalf("%s: no pod line (%q)", c.name, sc.Text())
		}
		resp, err := http.Get(pod.URL + "/server_info")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: /server_info: %v %v", c.name, resp, err)
		}
		resp.Body.Close()
		if err := c.stop(cmd, pod); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		err = cmd.Wait()
		timer.Stop()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if code != c.wantCode {
			t.Fatalf("%s: exit status %d, want %d", c.name, code, c.wantCode)
		}
	}
}
