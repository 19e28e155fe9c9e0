package picker

import "sync"

// CycleState is per-request scratch shared by the plugins of one cycle, read and written
// through typed keys. Safe for concurrent use (a PostPick may run on another goroutine).
// The zero value is ready to use.
type CycleState struct {
	mu sync.RWMutex
	// A cycle holds a handful of entries: a slice scanned linearly is cheaper than a map.
	entries []stateEntry
}

type stateEntry struct {
	name string
	val  any
}

// StateKey names one value in a CycleState and fixes its type: Read returns a value only
// as the type the key was declared with. Names are unique per value (a package prefixes its
// own: "pd.selection").
type StateKey[T any] struct{ name string }

// NewStateKey returns the key called name for values of type T.
func NewStateKey[T any](name string) StateKey[T] { return StateKey[T]{name: name} }

// Name is the key's name.
func (k StateKey[T]) Name() string { return k.name }

// Read returns the value stored under k, and whether there is one.
func (k StateKey[T]) Read(s *CycleState) (T, bool) {
	var zero T
	if s == nil {
		return zero, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i := range s.entries {
		if s.entries[i].name == k.name {
			v, ok := s.entries[i].val.(T)
			return v, ok
		}
	}
	return zero, false
}

// Write stores v under k, replacing what was there.
func (k StateKey[T]) Write(s *CycleState, v T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.entries {
		if s.entries[i].name == k.name {
			s.entries[i].val = v
			return
		}
	}
	if s.entries == nil {
		s.entries = make([]stateEntry, 0, 8)
	}
	s.entries = append(s.entries, stateEntry{name: k.name, val: v})
}
