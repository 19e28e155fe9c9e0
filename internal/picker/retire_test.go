package picker

import (
	"context"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
)

// TestRestartedPodInheritsNoAffinity: the prefix index forgets an endpoint once it leaves the
// pool, or comes back as another pod (a new address under the same name and port), off the
// request path; a pod restarted under the same name and port starts with no affinity, and the
// pods that stayed keep theirs.
func TestRestartedPodInheritsNoAffinity(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deps := NewDeps(nil, config.PrefixCache{})
	store := pool.NewStore()
	a := func(ip string) *pool.Endpoint { return pool.NewEndpoint("ns", "a", ip, 8000, 0, nil, nil) }
	b := pool.NewEndpoint("ns", "b", "10.0.0.9", 8000, 0, nil, nil)
	store.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{a("10.0.0.1"), b}, true)
	go deps.RetireDeparted(store)(ctx)

	hashes := prefix.Hash(nil, "a prompt both pods served, long enough for a few blocks of hashes", prefix.BlockBytes(4))
	held := func() map[string]int {
		out := map[string]int{}
		deps.Prefix.MatchBlocks("m", hashes, func(k string, n int) { out[k] = n })
		return out
	}
	waitFor := func(what string, cond func(map[string]int) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond(held()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the index holds %v", what, held())
			}
			time.Sleep(time.Millisecond)
		}
	}
	for _, step := range []struct {
		name string
		eps  []*pool.Endpoint
	}{
		{"restarted with a new address", []*pool.Endpoint{a("10.0.0.2"), b}},
		{"left the pool", []*pool.Endpoint{b}},
	} {
		deps.Prefix.Add("m", hashes, a("").Key())
		deps.Prefix.Add("m", hashes, b.Key())
		if h := held(); h[a("").Key()] != len(hashes) || h[b.Key()] != len(hashes) {
			t.Fatalf("warmed index %v", h)
		}
		store.Publish(pool.Info{Name: "p"}, step.eps, true)
		waitFor(step.name, func(h map[string]int) bool { return h[a("").Key()] == 0 })
		if h := held(); h[b.Key()] != len(hashes) {
			t.Errorf("%s: the pod that stayed lost its blocks: %v", step.name, h)
		}
	}
}
