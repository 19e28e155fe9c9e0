package launch

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// While no package finishes (one large package compiling), the line is still redrawn with a
// moving clock; after stop, nothing more is written.
func TestProgressClockMovesWithoutNewLines(t *testing.T) {
	var out lockedBuffer
	p := &progressLine{w: &out, tty: true, start: time.Now()}
	p.update("Building it: 3 of 9 packages compiled (now big/package)")
	stop := p.ticking()
	deadline := time.Now().Add(time.Minute)
	for strings.Count(out.String(), "\r") < 3 {
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("the line was not redrawn while nothing happened:\n%q", out.String())
		}
		time.Sleep(20 * time.Millisecond)
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
