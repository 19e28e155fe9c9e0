// Package load owns the gateway-side load signals Tandem keeps from its own request
// lifecycle rather than scraping: requests in flight per endpoint (routed by Tandem and
// not yet completed), per-second rates over the last minute (the drain rate), and the
// Clock they read. It must not decide anything; scorers read it.
package load

import (
	"sync"
	"sync/atomic"
)

// Tracker counts requests in flight per endpoint key. Safe for concurrent use.
type Tracker struct {
	counts sync.Map // endpoint key -> *atomic.Int64
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker { return &Tracker{} }

func (t *Tracker) counter(key string) *atomic.Int64 {
	if c, ok := t.counts.Load(key); ok {
		return c.(*atomic.Int64)
	}
	c, _ := t.counts.LoadOrStore(key, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// Start records one more request in flight on the endpoint and returns the function that
// ends it. The returned function is idempotent: calling it twice releases once.
func (t *Tracker) Start(key string) (done func()) {
	c := t.counter(key)
	c.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			if c.Add(-1) < 0 {
				c.Store(0)
			}
		})
	}
}

// InFlight is the number of requests currently in flight on the endpoint.
func (t *Tracker) InFlight(key string) int64 {
	if c, ok := t.counts.Load(key); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

// Lookup is InFlight plus whether the endpoint was ever counted. The seed's policies treat
// an endpoint the gateway never saw ("no RealtimeNumRequestsRunning metric") differently
// from one at zero.
func (t *Tracker) Lookup(key string) (n int64, ok bool) {
	if c, ok := t.counts.Load(key); ok {
		return c.(*atomic.Int64).Load(), true
	}
	return 0, false
}

// Keys lists the endpoints with a counter.
func (t *Tracker) Keys() []string {
	var keys []string
	t.counts.Range(func(k, _ any) bool { keys = append(keys, k.(string)); return true })
	return keys
}

// Forget drops an endpoint's counter (when it leaves the pool).
func (t *Tracker) Forget(key string) { t.counts.Delete(key) }
