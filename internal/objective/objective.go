// Package objective resolves the InferenceObjective a request names (x-gateway-inference-objective)
// to its priority: a negative priority makes the request sheddable under pd-predictive. The
// objectives come from Kubernetes (Watch: InferenceObjective objects of the pool's namespace that
// reference the pool, in the llm-d.ai group and the older inference.networking.x-k8s.io one) or
// from the endpoints file's `objectives:` list (Set.Replace). It must not score or pick.
package objective

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Set is the current objectives by name, read lock-free on the pick path. The zero value is
// empty and ready to use.
type Set struct {
	cur atomic.Pointer[map[string]int]

	mu      sync.Mutex                // serialises writers
	bySrc   map[string]map[string]int // per source (API group), for Watch
	sources []string                  // precedence: the first source naming an objective wins
}

// Priority is the priority of the objective called name; ok is false when no objective has
// that name (the request then has the default priority, 0, as in GIE). An objective without a
// priority has 0. The snapshot is not needed: objectives are per pool already.
func (s *Set) Priority(_ *pool.Snapshot, name string) (priority int, ok bool) {
	m := s.cur.Load()
	if m == nil {
		return 0, false
	}
	priority, ok = (*m)[name]
	return priority, ok
}

// Len is the number of objectives known.
func (s *Set) Len() int {
	if m := s.cur.Load(); m != nil {
		return len(*m)
	}
	return 0
}

// Replace makes byName the whole set (the endpoints file's list).
func (s *Set) Replace(byName map[string]int) {
	m := maps.Clone(byName)
	if m == nil {
		m = map[string]int{}
	}
	s.cur.Store(&m)
}

// setSource replaces one source's objectives and publishes the merged set.
func (s *Set) setSource(src string, byName map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bySrc == nil {
		s.bySrc = map[string]map[string]int{}
	}
	s.bySrc[src] = byName
	merged := map[string]int{}
	for i := len(s.sources) - 1; i >= 0; i-- { // lowest precedence first, overwritten by higher
		maps.Copy(merged, s.bySrc[s.sources[i]])
	}
	s.cur.Store(&merged)
}
