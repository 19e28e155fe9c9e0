package picker

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

// retireRig is a least-request chain over a pool of a and b, with the retirer running as the
// application runs it; next waits for a forgetting pass and says whether a and b were live.
type retireRig struct {
	t     *testing.T
	deps  *Deps
	chain *Chain
	store *pool.Store
	a, b  *pool.Endpoint
	v1    *pool.Snapshot
	asked chan []bool
}

func newRetireRig(t *testing.T) *retireRig {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := &retireRig{t: t, deps: NewDeps(nil, config.DefaultPD().PrefixCache), store: pool.NewStore(),
		a: ep("a", "", ""), b: ep("b", "", ""), asked: make(chan []bool, 4)}
	r.chain = NewLeastRequestStrategy(r.deps)
	r.deps.OnForget(func(live func(key string) bool) { r.asked <- []bool{live(r.a.Key()), live(r.b.Key())} })
	r.v1 = r.store.Publish(pool.Info{}, []*pool.Endpoint{r.a, r.b}, true)
	go r.deps.RetireDeparted(r.store)(ctx)
	return r
}

// pick starts a request on one of cands, picked on snap.
func (r *retireRig) pick(snap *pool.Snapshot, cands ...*pool.Endpoint) *Decision {
	r.t.Helper()
	d, err := r.chain.Pick(context.Background(), &Cycle{Req: parse(r.t, nil, "hi"), Snap: snap, Candidates: cands, State: &CycleState{}})
	if err != nil {
		r.t.Fatal(err)
	}
	return d
}

func (r *retireRig) next() []bool {
	r.t.Helper()
	select {
	case got := <-r.asked:
		return got
	case <-time.After(10 * time.Second):
		r.t.Fatal("the pool changed and nothing was forgotten within 10 s")
		return nil
	}
}

// keys are the endpoints Running and Drain keep state for.
func (r *retireRig) keys() [][]string { return [][]string{r.deps.Running.Keys(), r.deps.Drain.Keys()} }

// The per-endpoint signals every strategy shares (requests running, drain rate) must not
// keep an entry for every endpoint that ever existed: a pool served only by non-PD
// strategies still forgets the endpoints that left, off the request path, as the store
// publishes their departure; a pod restarted at another address under the same name starts
// afresh. Worked by hand: a and b each serve one completed request (both have a running
// counter and a drain window), then b leaves the pool, then a comes back as another pod.
// State registered with OnForget is asked about the same endpoints at the same moment.
func TestDepartedEndpointsAreForgotten(t *testing.T) {
	r := newRetireRig(t)
	a, b := r.a, r.b
	r.pick(r.v1, a).Lifecycle.Done(nil)
	r.pick(r.v1, b).Lifecycle.Done(nil)

	v2 := r.store.Publish(pool.Info{}, []*pool.Endpoint{a}, true)
	if got := r.next(); !slices.Equal(got, []bool{true, false}) {
		t.Errorf("b left: OnForget saw a, b live %v, want [true false]", got)
	}
	for i, ks := range r.keys() {
		if slices.Contains(ks, b.Key()) || !slices.Contains(ks, a.Key()) {
			t.Errorf("%s keys %v after b left; want only %s", []string{"running", "drain"}[i], ks, a.Key())
		}
	}

	r.pick(v2, a).Lifecycle.Done(nil)
	restarted := pool.NewEndpoint(a.Namespace, a.Name, "10.9.9.9", a.Port, 0, nil, nil)
	r.store.Publish(pool.Info{}, []*pool.Endpoint{restarted}, true)
	if got := r.next(); !slices.Equal(got, []bool{false, false}) {
		t.Errorf("a restarted (b long gone): OnForget saw a, b live %v, want [false false]", got)
	}
	for i, ks := range r.keys() {
		if len(ks) != 0 {
			t.Errorf("%s keys %v after a restarted at another address; want none", []string{"running", "drain"}[i], ks)
		}
	}
}

// A pod deleted with a request in flight (it leaves the pool), whose request ends after its
// state was forgotten, then back as a new pod under the same name (a StatefulSet restart): the
// late end brings nothing back, and the new pod starts from nothing. The same when the restart
// is seen in one change of the pool (another address under the same key).
func TestRestartStartsAfresh(t *testing.T) {
	r := newRetireRig(t)
	a, b := r.a, r.b
	d := r.pick(r.v1, b)
	r.store.Publish(pool.Info{}, []*pool.Endpoint{a}, true) // b leaves with a request in flight
	r.next()
	d.Lifecycle.Done(nil) // which ends now
	if slices.Contains(r.deps.Drain.Keys(), b.Key()) || slices.Contains(r.deps.Running.Keys(), b.Key()) {
		t.Errorf("drain %v, running %v: the late end brought the departed b back", r.deps.Drain.Keys(), r.deps.Running.Keys())
	}
	b2 := pool.NewEndpoint(b.Namespace, b.Name, "10.9.9.9", b.Port, 0, nil, nil)
	v3 := r.store.Publish(pool.Info{}, []*pool.Endpoint{a, b2}, true) // the new pod is ready
	r.next()
	if r.deps.Drain.PerSecond(b.Key()) != 0 || r.deps.Running.InFlight(b.Key()) != 0 {
		t.Errorf("the new pod b starts with drain %v/s, %d running", r.deps.Drain.PerSecond(b.Key()), r.deps.Running.InFlight(b.Key()))
	}

	d = r.pick(v3, b2)
	b3 := pool.NewEndpoint(b.Namespace, b.Name, "10.9.9.10", b.Port, 0, nil, nil)
	r.store.Publish(pool.Info{}, []*pool.Endpoint{a, b3}, true) // restarted again, in one change
	r.next()
	d.Lifecycle.Done(nil) // the old pod's request ends after the pass
	if r.deps.Drain.PerSecond(b.Key()) != 0 || r.deps.Running.InFlight(b.Key()) != 0 {
		t.Errorf("the old pod's late end counted on the new one: drain %v/s, %d running", r.deps.Drain.PerSecond(b.Key()), r.deps.Running.InFlight(b.Key()))
	}
}

// An unsynced snapshot (a source still listing, or one that lost its pool) forgets nothing;
// the next synced one forgets what left meanwhile.
func TestUnsyncedSnapshotForgetsNothing(t *testing.T) {
	r := newRetireRig(t)
	r.pick(r.v1, r.b).Lifecycle.Done(nil)
	r.store.Publish(pool.Info{}, nil, false)
	select {
	case got := <-r.asked:
		t.Errorf("a pass %v on an unsynced snapshot", got)
	case <-time.After(100 * time.Millisecond): // the retirer woke and let it be
	}
	r.store.Publish(pool.Info{}, []*pool.Endpoint{r.a}, true)
	if got := r.next(); !slices.Equal(got, []bool{true, false}) {
		t.Errorf("the pass on the synced snapshot: OnForget saw a, b live %v, want [true false]", got)
	}
}
