package file

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/tandem-epp/tandem/internal/pool"
)

const (
	oneEndpoint  = "endpoints: [{name: a, address: 127.0.0.1, port: 8000}]\n"
	twoEndpoints = "endpoints: [{name: a, address: 127.0.0.1, port: 8000}, {name: b, address: 127.0.0.2, port: 8000}]\n"
	badEndpoint  = "endpoints: [{name: a, address: abc, port: 8000}]\n"
)

// writeAtomic replaces path the way editors and config tools do: write a temporary file, rename it over.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type watched struct {
	t       *testing.T
	store   *pool.Store
	changes <-chan struct{}
	errs    chan error
}

func startWatch(t *testing.T, path string, configure func(*Watcher)) *watched {
	t.Helper()
	w := &watched{t: t, store: pool.NewStore(), errs: make(chan error, 16)}
	w.changes = w.store.Changes()
	ctx, cancel := context.WithCancel(context.Background())
	watcher := &Watcher{Path: path, Store: w.store, OnError: func(err error) { w.errs <- err }, Logger: testr.New(t)}
	if configure != nil {
		configure(watcher)
	}
	if err := watcher.Load(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = watcher.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("watcher did not stop within 5s")
		}
	})
	return w
}

func (w *watched) waitEndpoints(n int) *pool.Snapshot {
	w.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s := w.store.Load()
		if s.Synced && len(s.Endpoints) == n {
			return s
		}
		select {
		case <-w.changes:
		case err := <-w.errs:
			w.t.Fatalf("unexpected reload error: %v", err)
		case <-deadline:
			w.t.Fatalf("store never reached %d endpoints; has %d (v%d)", n, len(s.Endpoints), s.Version)
		}
	}
}

func (w *watched) waitError(want string) {
	w.t.Helper()
	select {
	case err := <-w.errs:
		if !strings.Contains(err.Error(), want) {
			w.t.Fatalf("error = %q, want it to contain %q", err, want)
		}
	case <-time.After(10 * time.Second):
		w.t.Fatalf("no error reported within 10s; want %q", want)
	}
}

func TestWatchReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "endpoints.yaml")
	writeAtomic(t, path, oneEndpoint)
	w := startWatch(t, path, nil)
	first := w.waitEndpoints(1)

	writeAtomic(t, path, twoEndpoints)
	w.waitEndpoints(2)

	// A bad version is reported exactly and the last good snapshot stays.
	if err := os.WriteFile(path, []byte(badEndpoint), 0o644); err != nil {
		t.Fatal(err)
	}
	w.waitError(`endpoints file ` + path + `: endpoints[0].address: "abc" is not an IP address`)
	if s := w.store.Load(); len(s.Endpoints) != 2 || !s.Synced || s.Version <= first.Version {
		t.Errorf("after a bad file the store has %d endpoints (v%d synced=%v); want the last good 2", len(s.Endpoints), s.Version, s.Synced)
	}
	good := w.store.Load().Version

	// A vanished file is reported; the endpoints stay.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	w.waitError("no such file or directory")
	if s := w.store.Load(); s.Version != good {
		t.Errorf("the store changed (v%d -> v%d) when the file vanished", good, s.Version)
	}

	writeAtomic(t, path, oneEndpoint)
	w.waitEndpoints(1)
}

// TestWatchConfigMapSwap follows a Kubernetes ConfigMap volume: the file is a symlink through
// ..data, and an update swaps ..data to a new directory in one rename.
func TestWatchConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "endpoints.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", oneEndpoint)
	if err := os.Symlink(filepath.Join("..data", "endpoints.yaml"), filepath.Join(dir, "endpoints.yaml")); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, filepath.Join(dir, "endpoints.yaml"), nil)
	w.waitEndpoints(1)
	version("..v2", twoEndpoints)
	w.waitEndpoints(2)
}

// TestWatchPollsWithoutNotifications proves the safety net alone picks up a change.
func TestWatchPollsWithoutNotifications(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeAtomic(t, path, oneEndpoint)
	w := startWatch(t, path, func(w *Watcher) { w.noNotify = true; w.PollInterval = 20 * time.Millisecond })
	w.waitEndpoints(1)
	writeAtomic(t, path, twoEndpoints)
	w.waitEndpoints(2)
}

func TestWatchFirstLoad(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeAtomic(t, bad, badEndpoint)
	store := pool.NewStore()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := Watch(ctx, bad, store, nil)
	if err == nil || err.Error() != "endpoints file "+bad+`: endpoints[0].address: "abc" is not an IP address` {
		t.Errorf("err = %v", err)
	}
	if s := store.Load(); s.Version != 0 || s.Synced {
		t.Errorf("a bad first file published v%d synced=%v", s.Version, s.Synced)
	}

	good := filepath.Join(dir, "good.yaml")
	writeAtomic(t, good, twoEndpoints)
	if err := Watch(ctx, good, store, nil); err != nil {
		t.Fatal(err)
	}
	if s := store.Load(); !s.Synced || len(s.Endpoints) != 2 {
		t.Errorf("after Watch returns the store must hold the file: v%d synced=%v endpoints=%d", s.Version, s.Synced, len(s.Endpoints))
	}
}
