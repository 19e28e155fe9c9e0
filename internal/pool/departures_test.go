package pool

import (
	"maps"
	"slices"
	"testing"
)

// A watcher that reads after several publishes gets every departure among them: a pod that
// left, one that came back at another address, and one that left and came back at its own.
func TestDeparturesSurviveCoalescedPublishes(t *testing.T) {
	s := NewStore()
	ep := func(name, addr string) *Endpoint { return NewEndpoint("ns", name, addr, 8000, 0, nil, nil) }
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.2"), ep("c", "10.0.0.3"), ep("d", "10.0.0.4")}, true)
	d := s.WatchDepartures()
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.9"), ep("d", "10.0.0.4")}, true) // c left, b moved
	s.Publish(Info{}, []*Endpoint{ep("b", "10.0.0.9"), ep("d", "10.0.0.4")}, true)                      // a left
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.9"), ep("d", "10.0.0.4")}, true) // a is back
	select {
	case <-d.C:
	default:
		t.Fatal("no notification after departures")
	}
	got := slices.Sorted(maps.Keys(d.Take()))
	want := []string{"ns/a:8000", "ns/b:8000", "ns/c:8000"}
	if !slices.Equal(got, want) {
		t.Fatalf("departures %v, want %v", got, want)
	}
	if again := d.Take(); again != nil {
		t.Fatalf("a second Take returned %v", again)
	}
	s.Publish(Info{}, []*Endpoint{ep("a", "10.0.0.1"), ep("b", "10.0.0.9"), ep("d", "10.0.0.4")}, true) // no change
	if keys := d.Take(); keys != nil {
		t.Fatalf("an unchanged pool recorded %v", keys)
	}
}
