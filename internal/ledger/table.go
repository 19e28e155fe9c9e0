package ledger

import (
	"maps"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// podTable is a copy-on-write map of per-pod entries: reads are lock-free, and the owning
// ledger adds and drops entries (rare: pods come and go) under its own mutex.
type podTable[T any] struct{ m atomic.Pointer[map[Pod]*T] }

func newPodTable[T any]() *podTable[T] {
	t := &podTable[T]{}
	t.m.Store(&map[Pod]*T{})
	return t
}

func (t *podTable[T]) get(p Pod) *T { return (*t.m.Load())[p] }

// getOrAdd returns the pod's entry, adding a zero one. The caller holds the ledger's mutex.
func (t *podTable[T]) getOrAdd(p Pod) *T {
	if e := t.get(p); e != nil {
		return e
	}
	next := maps.Clone(*t.m.Load())
	e := new(T)
	next[p] = e
	t.m.Store(&next)
	return e
}

// dropIdle forgets the pods idle reports true for and deletes their gauge series. The
// caller holds the ledger's mutex.
func (t *podTable[T]) dropIdle(idle func(*T) bool, g Gauges) {
	cur := *t.m.Load()
	var gone []Pod
	for p, e := range cur {
		if idle(e) {
			gone = append(gone, p)
		}
	}
	if len(gone) == 0 {
		return
	}
	next := maps.Clone(cur)
	for _, p := range gone {
		delete(next, p)
		g.DeleteTokenLoad(p.Namespace, p.Name)
	}
	t.m.Store(&next)
}

func (t *podTable[T]) pods() []Pod {
	m := *t.m.Load()
	out := make([]Pod, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	return out
}

// expired is a charge the janitor force-released.
type expired struct {
	pod    Pod
	tokens float64
	age    time.Duration
}

func logExpired(log logr.Logger, side string, exp []expired) {
	for _, x := range exp {
		log.Info("WARNING: token-load charge force-released after its TTL; a release never arrived",
			"ledger", side, "pod", x.pod.String(), "tokens", x.tokens, "age", x.age.String(), "variable", "AIBRIX_TOKEN_LOAD_TTL_SECONDS")
	}
}
