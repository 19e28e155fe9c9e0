package load

import (
	"math"
	"sync"
	"sync/atomic"
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
	keys  map[string]*Series
}

// Series is one key's events in a Rate, as a request holds on to the pod it counts on: what it
// records there after the key was forgotten (its pod left, or was replaced by another under the
// same key) reaches no one.
type Series struct {
	mu    sync.Mutex
	slot  [rateSlots]uint32
	stamp [rateSlots]int64 // the unix second each slot holds
	// remote is the other replicas' rate for the key (float64 bits), as last read.
	remote atomic.Uint64
}

// NewRate returns an empty rate reading clock (the system clock when nil).
func NewRate(clock Clock) *Rate {
	if clock == nil {
		clock = SystemClock{}
	}
	return &Rate{clock: clock, keys: map[string]*Series{}}
}

// Record counts one event for key now.
func (r *Rate) Record(key string) { r.RecordTo(r.Series(key)) }

// Series is key's series (made if it has none): RecordTo it later to count an event on the pod
// key names now. A nil Rate has none.
func (r *Rate) Series(key string) *Series {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	w := r.keys[key]
	r.mu.RUnlock()
	if w == nil {
		r.mu.Lock()
		if w = r.keys[key]; w == nil {
			w = &Series{}
			r.keys[key] = w
		}
		r.mu.Unlock()
	}
	return w
}

// RecordTo counts one event now in w (nil: none).
func (r *Rate) RecordTo(w *Series) {
	if r == nil || w == nil {
		return
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

// PerSecond is the number of events for key in the last 60 seconds divided by 60, this
// replica's and the other replicas' (SetRemote). A key never recorded reads 0.
func (r *Rate) PerSecond(key string) float64 {
	r.mu.RLock()
	w := r.keys[key]
	r.mu.RUnlock()
	if w == nil {
		return 0
	}
	return w.local(r.clock.Now().Unix()) + math.Float64frombits(w.remote.Load())
}

// Local is this replica's own rate for key (what it publishes).
func (r *Rate) Local(key string) float64 {
	r.mu.RLock()
	w := r.keys[key]
	r.mu.RUnlock()
	if w == nil {
		return 0
	}
	return w.local(r.clock.Now().Unix())
}

// SetRemote replaces the other replicas' rates: remote[key] for the keys it holds, 0 for every
// other key (nil: none).
func (r *Rate) SetRemote(remote map[string]float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, w := range r.keys {
		if _, ok := remote[k]; !ok {
			w.remote.Store(0)
		}
	}
	for k, v := range remote {
		w := r.keys[k]
		if w == nil {
			w = &Series{}
			r.keys[k] = w
		}
		w.remote.Store(math.Float64bits(v))
	}
}

func (w *Series) local(now int64) float64 {
	var n uint64
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.slot {
		if now-w.stamp[i] < rateSlots && w.stamp[i] <= now {
			n += uint64(w.slot[i])
		}
	}
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
