package filewatch

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
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
	var mu sync.Mutex
	var got []string
	var errs int
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, path, []byte("v1"), Options{Poll: 20 * time.Millisecond, Settle: 5 * time.Millisecond},
			func(b []byte) { mu.Lock(); got = append(got, string(b)); mu.Unlock() },
			func(error) { mu.Lock(); errs++; mu.Unlock() })
	}()
	waitFor := func(want []string, wantErrs int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			ok := len(got) == len(want) && errs == wantErrs
			for i := range want {
				ok = ok && got[i] == want[i]
			}
			g, e := append([]string(nil), got...), errs
			mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("reported %q and %d errors, want %q and %d", g, e, want, wantErrs)
			}
			time.Sleep(10 * time.Millisecond)
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
	var mu sync.Mutex
	var reads, notifies []error
	var got []string
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, path, nil, Options{Poll: 20 * time.Millisecond, NotifyFailed: func(err error) { mu.Lock(); notifies = append(notifies, err); mu.Unlock() }},
			func(b []byte) { mu.Lock(); got = append(got, string(b)); mu.Unlock() },
			func(err error) { mu.Lock(); reads = append(reads, err); mu.Unlock() })
	}()
	until := func(cond func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			ok := cond()
			mu.Unlock()
			if ok || time.Now().After(deadline) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	until(func() bool { return len(reads) > 0 }) // the watch has started and found no file
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("v1"), 0o600); err != nil {
		t.Fatal(err)
	}
	until(func() bool { return len(got) == 1 })
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != "v1" {
		t.Errorf("contents %q, want the file found by polling", got)
	}
	if len(notifies) != 1 {
		t.Errorf("NotifyFailed got %v, want the watch's one failure", notifies)
	}
	if len(reads) != 1 || !errors.Is(reads[0], fs.ErrNotExist) {
		t.Errorf("failed got %v, want only the missing file", reads)
	}
}
