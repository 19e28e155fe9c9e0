package picker

import (
	"context"
	"slices"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

// The per-endpoint signals every strategy shares (requests running, drain rate) must not
// keep an entry for every endpoint that ever existed: a pool served only by non-PD
// strategies still forgets the endpoints that left, at the first pick on a newer
// snapshot. A request still holding an older snapshot prunes nothing. Worked by hand:
// a and b each serve one completed request (both have a running counter and a drain
// window), then b leaves the pool. State registered with OnForget is asked about the same
// endpoints at the same moment, once per newer snapshot.
func TestChainForgetsEndpointsThatLeft(t *testing.T) {
	deps := NewDeps(nil, config.DefaultPD().PrefixCache)
	chain := NewLeastRequestStrategy(deps)
	a, b := ep("a", "", ""), ep("b", "", "")
	var asked [][]bool // per OnForget call: is a live, is b live
	deps.OnForget(func(live func(key string) bool) { asked = append(asked, []bool{live(a.Key()), live(b.Key())}) })
	store := pool.NewStore()
	v1 := store.Publish(pool.Info{}, []*pool.Endpoint{a, b}, true)
	pickOn := func(snap *pool.Snapshot, cands ...*pool.Endpoint) *Decision {
		t.Helper()
		d, err := chain.Pick(context.Background(), &Cycle{Req: parse(t, nil, "hi"), Snap: snap, Candidates: cands, State: &CycleState{}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	pickOn(v1, a).Lifecycle.Done(nil)
	pickOn(v1, b).Lifecycle.Done(nil)

	v2 := store.Publish(pool.Info{}, []*pool.Endpoint{a}, true)
	pickOn(v1, a).Lifecycle.Done(nil) // an older snapshot: nothing is forgotten
	if !slices.Contains(deps.Running.Keys(), b.Key()) {
		t.Fatal("a pick on an older snapshot forgot b")
	}
	pickOn(v2, a).Lifecycle.Done(nil)
	cases := []struct {
		name string
		keys []string
	}{
		{"running", deps.Running.Keys()},
		{"drain", deps.Drain.Keys()},
	}
	for _, tc := range cases {
		if slices.Contains(tc.keys, b.Key()) || !slices.Contains(tc.keys, a.Key()) {
			t.Errorf("%s keys %v after b left; want only %s", tc.name, tc.keys, a.Key())
		}
	}
	pickOn(v2, a).Lifecycle.Done(nil) // the same snapshot again: nothing more to prune
	if want := [][]bool{{true, true}, {true, false}}; !slices.EqualFunc(asked, want, slices.Equal[[]bool]) {
		t.Errorf("OnForget saw %v, want %v (v1 once, then v2 once)", asked, want)
	}
}
