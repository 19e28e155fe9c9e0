package app

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedWriter is a log destination the test reads while the app may still write.
type lockedWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// A misspelt AIBRIX_/TANDEM_ variable is a warning at start naming the variable it resembles.
func TestMisspeltEnvironmentVariableIsAWarningWithASuggestion(t *testing.T) {
	getenv := func(string) string { return "" }
	opts, err := ParseFlags([]string{"--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0",
		"--bind-address=127.0.0.1", "--secure-serving=false", "--endpoints-file=" + writePool(t, pdPool)}, io.Discard, getenv)
	if err != nil {
		t.Fatal(err)
	}
	opts.metricsAnyPort = true
	out := &lockedWriter{}
	opts.Zap.DestWriter = out
	a, err := New(context.Background(), opts, Env{Getenv: getenv,
		Environ: []string{"PATH=/bin", "AIBRIX_PROMPT_LENGTH_BUCKETNG=true"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Run did not return after cancel")
	}
	var line string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "AIBRIX_PROMPT_LENGTH_BUCKETNG") {
			line = l
		}
	}
	for _, want := range []string{"WARNING: unknown environment variable", "did you mean AIBRIX_PROMPT_LENGTH_BUCKETING?"} {
		if !strings.Contains(line, want) {
			t.Errorf("the log line %q lacks %q (log:\n%s)", line, want, out.String())
		}
	}
}
