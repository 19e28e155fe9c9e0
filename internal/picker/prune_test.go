package picker

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

// The per-endpoint signals every strategy shares (requests running, drain rate) must not
// keep an entry for every endpoint that ever existed: a pool served only by non-PD
// strategies still forgets the endpoints that left, off the request path, as the store
// publishes their departure; a pod restarted at another address under the same name starts
// afresh. Worked by hand: a and b each serve one completed request (both have a running
// counter and a drain window), then b leaves the pool, then a comes back as another pod.
// State registered with OnForget is asked about the same endpoints at the same moment.
func TestDepartedEndpointsAreForgotten(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deps := NewDeps(nil, config.DefaultPD().PrefixCache)
	chain := NewLeastRequestStrategy(deps)
	a, b := ep("a", "", ""), ep("b", "", "")
	asked := make(chan []bool, 4) // per OnForget call: is a live, is b live
	deps.OnForget(func(live func(key string) bool) { asked <- []bool{live(a.Key()), live(b.Key())} })
	store := pool.NewStore()
	v1 := store.Publish(pool.Info{}, []*pool.Endpoint{a, b}, true)
	go deps.RetireDeparted(store)(ctx)
	pickOn := func(snap *pool.Snapshot, cands ...*pool.Endpoint) {
		t.Helper()
		d, err := chain.Pick(context.Background(), &Cycle{Req: parse(t, nil, "hi"), Snap: snap, Candidates: cands, State: &CycleState{}})
		if err != nil {
			t.Fatal(err)
		}
		d.Lifecycle.Done(nil)
	}
	pickOn(v1, a)
	pickOn(v1, b)
	keys := func() [][]string { return [][]string{deps.Running.Keys(), deps.Drain.Keys()} }
	next := func() []bool {
		t.Helper()
		select {
		case got := <-asked:
			return got
		case <-time.After(10 * time.Second):
			t.Fatal("the pool changed and nothing was forgotten within 10 s")
			return nil
		}
	}

	v2 := store.Publish(pool.Info{}, []*pool.Endpoint{a}, true)
	if got := next(); !slices.Equal(got, []bool{true, false}) {
		t.Errorf("b left: OnForget saw a, b live %v, want [true false]", got)
	}
	for i, ks := range keys() {
		if slices.Contains(ks, b.Key()) || !slices.Contains(ks, a.Key()) {
			t.Errorf("%s keys %v after b left; want only %s", []string{"running", "drain"}[i], ks, a.Key())
		}
	}

	pickOn(v2, a)
	restarted := pool.NewEndpoint(a.Namespace, a.Name, "10.9.9.9", a.Port, 0, nil, nil)
	store.Publish(pool.Info{}, []*pool.Endpoint{restarted}, true)
	if got := next(); !slices.Equal(got, []bool{false, false}) {
		t.Errorf("a restarted (b long gone): OnForget saw a, b live %v, want [false false]", got)
	}
	for i, ks := range keys() {
		if len(ks) != 0 {
			t.Errorf("%s keys %v after a restarted at another address; want none", []string{"running", "drain"}[i], ks)
		}
	}
}

// A pod deleted with a request in flight (it leaves the pool), whose request ends after its
// state was forgotten and counts its completion there again, then back as a new pod under the
// same name (a StatefulSet restart, no other change of the pool between): the new pod starts
// from nothing.
func TestRestartAfterAGapStartsAfresh(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deps := NewDeps(nil, config.DefaultPD().PrefixCache)
	chain := NewLeastRequestStrategy(deps)
	a, b := ep("a", "", ""), ep("b", "", "")
	forgot := make(chan struct{}, 4)
	deps.OnForget(func(func(string) bool) { forgot <- struct{}{} })
	store := pool.NewStore()
	v1 := store.Publish(pool.Info{}, []*pool.Endpoint{a, b}, true)
	go deps.RetireDeparted(store)(ctx)
	wait := func() {
		t.Helper()
		select {
		case <-forgot:
		case <-time.After(10 * time.Second):
			t.Fatal("the pool changed and nothing was forgotten within 10 s")
		}
	}
	d, err := chain.Pick(context.Background(), &Cycle{Req: parse(t, nil, "hi"), Snap: v1, Candidates: []*pool.Endpoint{b}, State: &CycleState{}})
	if err != nil {
		t.Fatal(err)
	}
	store.Publish(pool.Info{}, []*pool.Endpoint{a}, true) // b leaves with a request in flight
	wait()
	d.Lifecycle.Done(nil) // which ends now, counting b's completion
	if !slices.Contains(deps.Drain.Keys(), b.Key()) {
		t.Fatal("setup: the late end recorded nothing on b")
	}
	b2 := pool.NewEndpoint(b.Namespace, b.Name, "10.9.9.9", b.Port, 0, nil, nil)
	store.Publish(pool.Info{}, []*pool.Endpoint{a, b2}, true) // the new pod is ready
	wait()
	if slices.Contains(deps.Drain.Keys(), b.Key()) || slices.Contains(deps.Running.Keys(), b.Key()) {
		t.Errorf("drain %v, running %v: the new pod b inherits the old one's late state", deps.Drain.Keys(), deps.Running.Keys())
	}
}
