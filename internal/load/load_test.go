package load

import (
	"testing"
	"time"
)

func TestRateOverTheLastMinute(t *testing.T) {
	c := NewManualClock(time.Unix(10_000, 0))
	r := NewRate(c)
	if r.PerSecond("a") != 0 {
		t.Fatal("unknown key")
	}
	for range 30 {
		r.Record("a")
	}
	c.Advance(30 * time.Second)
	for range 30 {
		r.Record("a")
	}
	if got := r.PerSecond("a"); got != 1 {
		t.Fatalf("60 in a minute: %v/s", got)
	}
	c.Advance(30 * time.Second) // the first 30 fall out of the window
	if got := r.PerSecond("a"); got != 0.5 {
		t.Fatalf("%v/s", got)
	}
	c.Advance(time.Hour)
	if got := r.PerSecond("a"); got != 0 {
		t.Fatalf("%v/s after an hour", got)
	}
	r.Forget("a")
	if len(r.Keys()) != 0 {
		t.Fatal("forget")
	}
}

func TestTrackerLookup(t *testing.T) {
	tr := NewTracker()
	if _, ok := tr.Lookup("a"); ok {
		t.Fatal("never counted")
	}
	done := tr.Start("a")
	done()
	done()
	if n, ok := tr.Lookup("a"); !ok || n != 0 {
		t.Fatalf("%d %v", n, ok)
	}
	if len(tr.Keys()) != 1 {
		t.Fatal("keys")
	}
}
