package load

import (
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
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

func TestTrackerOfEndpointFollowsForget(t *testing.T) {
	tr, other := NewTracker(), NewTracker()
	e := pool.NewEndpoint("ns", "pod", "10.0.0.1", 8000, 0, nil, nil)
	if n, ok := tr.LookupOf(e); n != 0 || ok {
		t.Fatalf("never counted: LookupOf = %d, %v", n, ok)
	}
	done := tr.Start(e.Key())
	other.Start(e.Key())
	other.Start(e.Key())
	if n, ok := tr.LookupOf(e); n != 1 || !ok {
		t.Fatalf("one started: LookupOf = %d, %v", n, ok)
	}
	if n := other.InFlightOf(e); n != 2 { // a second tracker on the same endpoint keeps its own count
		t.Fatalf("the other tracker reads %d, want 2", n)
	}
	done()
	if n := tr.InFlightOf(e); n != 0 {
		t.Fatalf("ended: InFlightOf = %d", n)
	}
	// Forget drops the counter the endpoint remembers; a new one counts from scratch.
	tr.Start(e.Key())
	tr.Forget(e.Key())
	if n, ok := tr.LookupOf(e); n != 0 || ok {
		t.Fatalf("forgotten: LookupOf = %d, %v", n, ok)
	}
	tr.Start(e.Key())
	tr.Start(e.Key())
	if n, ok := tr.LookupOf(e); n != 2 || !ok {
		t.Fatalf("counted again after Forget: LookupOf = %d, %v, want 2, true", n, ok)
	}
	if n, _ := tr.Lookup(e.Key()); n != 2 {
		t.Fatalf("Lookup by key = %d, want what LookupOf reads", n)
	}
}
