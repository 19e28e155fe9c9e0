package file

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Defaults for Watcher.
const (
	DefaultPollInterval = 30 * time.Second
	// settle lets a burst of events (an editor's truncate + write, a ConfigMap's symlink swap)
	// end before the file is read.
	settle = 50 * time.Millisecond
)

// Watch loads path, publishes it as a synced snapshot, and then keeps the store in step with
// the file until ctx ends, in the background. The first load's error is returned (nothing is
// published then); later bad versions keep the last good snapshot and go to onError (may be nil).
func Watch(ctx context.Context, path string, store *pool.Store, onError func(error)) error {
	w := &Watcher{Path: path, Store: store, OnError: onError}
	if err := w.Load(); err != nil {
		return err
	}
	go w.run(ctx) //nolint:errcheck // run reports through OnError and the log
	return nil
}

// Watcher keeps a Store in step with an endpoints file. Use Watch, or set the fields, call
// Load once and then Run.
type Watcher struct {
	Path  string
	Store *pool.Store
	// OnError receives every failed reload (a metric or an event hook); nil ignores them.
	OnError func(error)
	// OnReload is told the number of endpoints after each successful load; nil ignores it.
	OnReload func(endpoints int)
	// PollInterval re-reads the file as a safety net for missed notifications; 0 means DefaultPollInterval.
	PollInterval time.Duration
	Logger       logr.Logger

	noNotify bool   // tests: rely on polling alone
	last     []byte // content last acted on, good or bad
	missing  bool   // the last read found no file
}

// Load reads the file once and publishes it if it is good and differs from the last content
// acted on. A bad file is reported and the store keeps its snapshot.
func (w *Watcher) Load() error {
	data, err := os.ReadFile(w.Path)
	if err != nil {
		err = fmt.Errorf("endpoints file: %w", err)
		if w.last != nil && !w.missing { // report a vanished file once, until it comes back
			w.fail(err)
		}
		w.missing = true
		return err
	}
	w.missing = false
	if w.last != nil && bytes.Equal(data, w.last) {
		return nil
	}
	w.last = data
	info, eps, err := Parse(data)
	if err != nil {
		err = fmt.Errorf("endpoints file %s: %w", w.Path, err)
		w.fail(err)
		return err
	}
	snap := w.Store.Publish(info, eps, true)
	w.Logger.Info("endpoints file loaded", "path", w.Path, "endpoints", len(eps), "version", snap.Version)
	if w.OnReload != nil {
		w.OnReload(len(eps))
	}
	return nil
}

func (w *Watcher) fail(err error) {
	w.Logger.Error(err, "endpoints file rejected; keeping the last good endpoints")
	if w.OnError != nil {
		w.OnError(err)
	}
}

// Run watches the file's directory (so atomic renames and ConfigMap symlink swaps are seen) and
// polls it, reloading on change until ctx ends. Call Load first.
func (w *Watcher) Run(ctx context.Context) error { return w.run(ctx) }

func (w *Watcher) run(ctx context.Context) error {
	var events <-chan fsnotify.Event
	var errs <-chan error
	if !w.noNotify {
		n, err := fsnotify.NewWatcher()
		if err != nil {
			w.fail(fmt.Errorf("watching %s: %w; polling only", w.Path, err))
		} else {
			defer n.Close()
			if err := n.Add(filepath.Dir(w.Path)); err != nil {
				w.fail(fmt.Errorf("watching %s: %w; polling only", filepath.Dir(w.Path), err))
			} else {
				events, errs = n.Events, n.Errors
			}
		}
	}
	// The file may have changed between the caller's Load and the watch being set up.
	_ = w.Load()
	interval := w.PollInterval
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	poll := time.NewTicker(interval)
	defer poll.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-events:
			debounce.Reset(settle)
		case err := <-errs:
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				debounce.Reset(settle)
				continue
			}
			w.Logger.Error(err, "file notification error", "path", w.Path)
		case <-debounce.C:
			_ = w.Load() // reported inside
		case <-poll.C:
			_ = w.Load()
		}
	}
}
