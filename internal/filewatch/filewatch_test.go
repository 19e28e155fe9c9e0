package filewatch

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// A real file on disk: each distinct content is reported once, through a rename (how a
// ConfigMap swaps files) as through a rewrite; an unchanged write is not; a vanished file is
// reported once.
func TestWatchReportsEachNewContentOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "epp.yaml")
	if err := os.WriteFile(path, []byte("v1"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := newReports()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, path, []byte("v1"), Options{Poll: 20 * time.Millisecond, Settle: 5 * time.Millisecond}, r.changed, r.failed)
	}()
	waitFor := func(want []string, wantErrs int) {
		t.Helper()
		var g []string
		var e int
		if !r.until(func() bool {
			g, e = slices.Clone(r.got), len(r.reads)
			return slices.Equal(g, want) && e == wantErrs
		}) {
			t.Fatalf("reported %q and %d errors, want %q and %d", g, e, want, wantErrs)
		}
	}
	if err := os.WriteFile(path, []byte("v2"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor([]string{"v2"}, 0)
	if err := os.WriteFile(path, []byte("v2"), 0o600); err != nil { // same content
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "new")
	if err := os.WriteFile(tmp, []byte("v3"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor([]string{"v2", "v3"}, 0)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	waitFor([]string{"v2", "v3"}, 1)
	time.Sleep(60 * time.Millisecond) // polls while missing report nothing more
	waitFor([]string{"v2", "v3"}, 1)
	cancel()
	<-done
}

// A failure to set up change notifications (an exhausted inotify limit, a directory that cannot
// be watched) is not a failed read of the file: failed hears only about reading it, the
// notifier's trouble goes to NotifyFailed, and polling carries on. (The config-file reload
// counted a notification failure as a rejected configuration and set
// tandem_config_file_applied to 0 while the file was fine.)
func TestNotificationFailureIsNotAFailedRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "later", "epp.yaml") // its directory does not exist yet: no watch
	r := newReports()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, path, nil, Options{Poll: 20 * time.Millisecond, NotifyFailed: r.notifyFailed}, r.changed, r.failed)
	}()
	r.until(func() bool { return len(r.reads) > 0 }) // the watch has started and found no file
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("v1"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.until(func() bool { return len(r.got) == 1 })
	cancel()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) != 1 || r.got[0] != "v1" {
		t.Errorf("contents %q, want the file found by polling", r.got)
	}
	if len(r.notifies) != 1 {
		t.Errorf("NotifyFailed got %v, want the watch's one failure", r.notifies)
	}
	if len(r.reads) != 1 || !errors.Is(r.reads[0], fs.ErrNotExist) {
		t.Errorf("failed got %v, want only the missing file", r.reads)
	}
}

// reports records what a watch calls back; each call wakes until.
type reports struct {
	mu              sync.Mutex
	got             []string // changed's contents
	reads, notifies []error  // failed's and NotifyFailed's errors
	woke            chan struct{}
}

func newReports() *reports { return &reports{woke: make(chan struct{}, 1)} }

func (r *reports) changed(b []byte)       { r.record(func() { r.got = append(r.got, string(b)) }) }
func (r *reports) failed(err error)       { r.record(func() { r.reads = append(r.reads, err) }) }
func (r *reports) notifyFailed(err error) { r.record(func() { r.notifies = append(r.notifies, err) }) }
func (r *reports) record(add func()) {
	r.mu.Lock()
	add()
	r.mu.Unlock()
	select {
	case r.woke <- struct{}{}:
	default:
	}
}

// until waits for cond (called with mu held) to hold, checking it after each report, and
// reports whether it held within 10 s.
func (r *reports) until(cond func() bool) bool {
	timeout := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-r.woke:
		case <-timeout:
			return false
		}
	}
}
