// Package filewatch owns watching one file's content: it calls back with the bytes each
// time they change, seeing editors' truncate-and-write, atomic renames and Kubernetes
// ConfigMap symlink swaps (it watches the directory), and polling as a safety net for missed
// notifications. It must not parse or apply anything.
package filewatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Options tune a watch; zero fields take the defaults.
type Options struct {
	// Poll re-reads the file this often even without a notification (default 30 s).
	Poll time.Duration
	// Settle lets a burst of events end before the file is read (default 50 ms).
	Settle time.Duration
	// NoNotify relies on polling alone (tests, filesystems without notifications).
	NoNotify bool
	// NotifyFailed hears why change notifications could not be set up or were lost (an
	// exhausted inotify limit, a directory that cannot be watched); polling carries on. It is
	// not a failure to read the file. nil ignores them.
	NotifyFailed func(error)
}

// Watch calls changed with the file's content each time it differs from the content last
// passed (initial is the content the caller already applied, nil for none), and failed with
// every error reading it (a vanished file once, until it comes back), until ctx ends.
// Trouble with change notifications goes to Options.NotifyFailed, never to failed. An
// empty file is taken for one caught mid-write and waited out.
func Watch(ctx context.Context, path string, initial []byte, o Options, changed func([]byte), failed func(error)) {
	if o.Poll <= 0 {
		o.Poll = 30 * time.Second
	}
	if o.Settle <= 0 {
		o.Settle = 50 * time.Millisecond
	}
	last, missing := initial, false
	read := func() {
		data, err := os.ReadFile(path)
		if err != nil {
			if !missing {
				failed(err)
			}
			missing = true
			return
		}
		missing = false
		if len(data) == 0 {
			return // caught between an editor's truncate and its write: wait for the content
		}
		if last != nil && bytes.Equal(data, last) {
			return
		}
		last = data
		changed(data)
	}
	notifyFailed := o.NotifyFailed
	if notifyFailed == nil {
		notifyFailed = func(error) {}
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	if !o.NoNotify {
		if n, err := fsnotify.NewWatcher(); err != nil {
			notifyFailed(fmt.Errorf("watching %s: %w; polling every %v only", path, err, o.Poll))
		} else {
			defer n.Close()
			if err := n.Add(filepath.Dir(path)); err != nil {
				notifyFailed(fmt.Errorf("watching %s: %w; polling every %v only", filepath.Dir(path), err, o.Poll))
			} else {
				events, errs = n.Events, n.Errors
			}
		}
	}
	read() // it may have changed before the watch was set up
	poll := time.NewTicker(o.Poll)
	defer poll.Stop()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-events:
			settle.Reset(o.Settle)
		case err := <-errs:
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				settle.Reset(o.Settle)
				continue
			}
			notifyFailed(err)
		case <-settle.C:
			read()
		case <-poll.C:
			read()
		}
	}
}
