package demo

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// EPPEnv is the environment the demo gives Tandem: prompt-length bucketing on, so the pods'
// promptLenBucket ranges split short and long prompts (the seed's AIBRIX_* variable). An
// in-process runner must set it in the process environment before starting Tandem.
var EPPEnv = map[string]string{"AIBRIX_PROMPT_LENGTH_BUCKETING": "true"}

// BuildEPP compiles ./cmd/epp of the repository at root into dir and returns the binary. It
// builds what `make demo` runs: -tags nokube, an epp that reads its pool from an endpoints file
// and links no Kubernetes client.
func BuildEPP(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "epp")
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "nokube", "-o", bin, "./cmd/epp")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building ./cmd/epp: %w\n%s", err, out)
	}
	return bin, nil
}

// ProcessEPP runs Tandem as a child process of bin, with EPPEnv and env added to the
// environment and its output in logPath. Ending ctx sends SIGTERM, then SIGKILL after 10s.
func ProcessEPP(bin, logPath string, env map[string]string) EPPRunner {
	return func(ctx context.Context, args []string) error {
		logf, err := os.Create(logPath)
		if err != nil {
			return err
		}
		defer logf.Close()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = os.Environ()
		for _, m := range []map[string]string{EPPEnv, env} {
			for k, v := range m {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 10 * time.Second
		err = cmd.Run()
		if ctx.Err() != nil {
			return nil // stopped on purpose
		}
		if err != nil {
			return fmt.Errorf("%s exited: %w (log: %s)", bin, err, logPath)
		}
		return fmt.Errorf("%s exited early (log: %s)", bin, logPath)
	}
}
