package load

import (
	"sync"
	"time"
)

// rateSlots is the window of a Rate in one-second slots: the seed's "1-minute" rates.
const rateSlots = 60

// Rate counts events per key over the last minute (in one-second slots) and reports them
// per second. Tandem uses it for the drain rate: requests a pod completed in the last
// minute / 60. Safe for concurrent use; reads never allocate.
type Rate struct {
	clock Clock
	mu    sync.RWMutex
	keys  map[string]*window
}

type window struct {
	mu    sync.Mutex
	slot  [rateSlots]uint32
	stamp [rateSlots]int64 // the unix second each slot holds
}

// NewRate returns an empty rate reading clock (the system clock when nil).
func NewRate(clock Clock) *Rate {
	if clock == nil {
		clock = SystemClock{}
	}
	return &Rate{clock: clock, keys: map[string]*window{}}
}

// Record counts one event for key now.
func (r *Rate) Record(key string) {
	r.mu.RLock()
	w := r.keys[key]
	r.mu.RUnlock()
	if w == nil {
		r.mu.Lock()
		if w = r.keys[key]; w == nil {
			w = &window{}
			r.keys[key] = w
		}
		r.mu.Unlock()
	}
	sec := r.clock.Now().Unix()
	i := int(uint64(sec) % rateSlots)
	w.mu.Lock()
	if w.stamp[i] != sec {
		w.stamp[i], w.slot[i] = sec, 0
	}
	w.slot[i]++
	w.mu.Unlock()
}

// PerSecond is the number of events for key in the last 60 seconds divided by 60.
// A key never recorded reads 0.
func (r *Rate) PerSecond(key string) float64 {
	r.mu.RLock()
	w := r.keys[key]
	r.mu.RUnlock()
	if w == nil {
		return 0
	}
	now := r.clock.Now().Unix()
	var n uint64
	w.mu.Lock()
	for i := range w.slot {
		if now-w.stamp[i] < rateSlots && w.stamp[i] <= now {
			n += uint64(w.slot[i])
		}
	}
	w.mu.Unlock()
	return float64(n) / rateSlots
}

// Forget drops a key (its endpoint left the pool).
func (r *Rate) Forget(key string) {
	r.mu.Lock()
	delete(r.keys, key)
	r.mu.Unlock()
}

// Keys lists the recorded keys.
func (r *Rate) Keys() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.keys))
	for k := range r.keys {
		out = append(out, k)
	}
	return out
}

// Window is the span a Rate averages over.
const Window = rateSlots * time.Second
