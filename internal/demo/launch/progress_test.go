package launch

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a buffer safe for concurrent use; wrote receives (without blocking) after
// each write.
type lockedBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{}
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	n, err := l.b.Write(p)
	l.mu.Unlock()
	select {
	case l.wrote <- struct{}{}:
	default:
	}
	return n, err
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// While no package finishes (one large package compiling), the line is still redrawn with a
// moving clock; after stop, nothing more is written.
func TestProgressClockMovesWithoutNewLines(t *testing.T) {
	out := lockedBuffer{wrote: make(chan struct{}, 1)}
	p := &progressLine{w: &out, tty: true, start: time.Now()}
	p.update("Building it: 3 of 9 packages compiled (now big/package)")
	stop := p.ticking()
	deadline := time.After(time.Minute)
	for strings.Count(out.String(), "\r") < 3 {
		select {
		case <-out.wrote:
		case <-deadline:
			stop()
			t.Fatalf("the line was not redrawn while nothing happened:\n%q", out.String())
		}
	}
	stop()
	stop() // a second stop is harmless
	frames := strings.Split(out.String(), "\r")
	last := frames[len(frames)-1]
	if !strings.Contains(last, "(now big/package) [") || strings.Contains(last, "[0s]") {
		t.Errorf("the last redraw %q does not show the package and a clock past 0s", last)
	}
	n := len(out.String())
	time.Sleep(1500 * time.Millisecond) // longer than one tick: a stopped clock writes nothing
	if len(out.String()) != n {
		t.Errorf("the line was redrawn after stop")
	}
}
