package file

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/filewatch"
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
	// OnObjectives receives the file's objectives after each successful load (before the
	// endpoints are published); nil ignores them.
	OnObjectives func(byName map[string]int)
	// PairMatch are the labels whose values must match between paired pods (each
	// endpoint's Revision); nil matches none.
	PairMatch pool.PairMatch
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
	return w.apply(data)
}

// apply parses one content of the file and publishes it unless it is the last one acted on.
func (w *Watcher) apply(data []byte) error {
	if w.last != nil && bytes.Equal(data, w.last) {
		return nil
	}
	w.last = data
	d, err := ParseDocumentMatching(data, w.PairMatch)
	if err != nil {
		err = fmt.Errorf("endpoints file %s: %w", w.Path, err)
		w.fail(err)
		return err
	}
	if w.OnObjectives != nil {
		w.OnObjectives(d.Objectives)
	}
	eps := d.Endpoints
	snap := w.Store.Publish(d.Info, eps, true)
	w.Logger.Info("endpoints file loaded", "path", w.Path, "endpoints", len(eps), "objectives", len(d.Objectives), "version", snap.Version)
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
// polls it, reloading on change until ctx ends (internal/filewatch). Call Load first.
func (w *Watcher) Run(ctx context.Context) error { return w.run(ctx) }

func (w *Watcher) run(ctx context.Context) error {
	interval := w.PollInterval
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	filewatch.Watch(ctx, w.Path, w.last, filewatch.Options{Poll: interval, Settle: settle, NoNotify: w.noNotify,
		NotifyFailed: func(err error) {
			w.Logger.Error(err, "no change notifications for the endpoints file; it is re-read on a timer")
		}},
		func(data []byte) { _ = w.apply(data) }, // reported inside
		func(err error) { w.fail(fmt.Errorf("endpoints file: %w", err)) })
	return nil
}
