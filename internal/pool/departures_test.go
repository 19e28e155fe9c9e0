package pool

import (
	"maps"
	"slices"
	"testing"
)

// A watcher that reads after several publishes gets every departure among them: a pod that
// left, one that came back at another address, one that left and came back at its own, and
// one that joined (a key whose pod is not the one known under it before).
func TestDeparturesSurviveCoalescedPublishes(t *testing.T) {
	s := NewStore()
	first := s.WatchDepartures()
	ep := func(name, addr string) *Endpoint { return NewEndpoint("ns", name, addr, 8000, 0, nil, nil) }
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.2"), ep("c", "10.0.0.3"), ep("d", "10.0.0.4")}, true)
	if keys := first.Take(); keys != nil {
		t.Fatalf("the first snapshot recorded %v: a store's first pool replaces nothing", keys)
	}
	d := s.WatchDepartures()
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.9"), ep("d", "10.0.0.4")}, true)                      // c left, b moved
	s.Publish(Info{}, []*Endpoint{ep("b", "10.0.0.9"), ep("d", "10.0.0.4")}, true)                                           // a left
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.9"), ep("d", "10.0.0.4")}, true)                      // a is back
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.9"), ep("d", "10.0.0.4"), ep("e", "10.0.0.5")}, true) // e joined
	select {
	case <-d.C:
	default:
		t.Fatal("no notification after departures")
	}
	got := slices.Sorted(maps.Keys(d.Take()))
	want := []string{"ns/a:8000", "ns/b:8000", "ns/c:8000", "ns/e:8000"}
	if !slices.Equal(got, want) {
		t.Fatalf("departures %v, want %v", got, want)
	}
	if again := d.Take(); again != nil {
		t.Fatalf("a second Take returned %v", again)
	}
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.9"), ep("d", "10.0.0.4"), ep("e", "10.0.0.5")}, true) // no change
	if keys := d.Take(); keys != nil {
		t.Fatalf("an unchanged pool recorded %v", keys)
	}
}

// An unsynced snapshot in between (a source that lost its pool for a while, or is listing it
// again) says nothing of which pods left: departures count from the last synced snapshot.
func TestDeparturesSkipUnsyncedSnapshots(t *testing.T) {
	s := NewStore()
	ep := func(name, addr string) *Endpoint { return NewEndpoint("ns", name, addr, 8000, 0, nil, nil) }
	d := s.WatchDepartures()
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1")}, false) // still listing
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.2")}, true)
	if keys := d.Take(); keys != nil {
		t.Fatalf("the first synced pool recorded %v", keys)
	}
	s.Publish(Info{}, nil, false) // the pool was lost for a while
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.2")}, true)
	if keys := d.Take(); keys != nil {
		t.Fatalf("the same pool after an unsynced gap recorded %v", keys)
	}
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1")}, false)
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("c", "10.0.0.3")}, true)
	if got := slices.Sorted(maps.Keys(d.Take())); !slices.Equal(got, []string{"ns/b:8000", "ns/c:8000"}) {
		t.Fatalf("departures %v, want b (left) and c (joined)", got)
	}
}
