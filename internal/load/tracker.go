// Package load owns the gateway-side load signals Tandem keeps from its own request
// lifecycle rather than scraping: requests in flight per endpoint (routed by Tandem and
// not yet completed), per-second rates over the last minute (the drain rate), and the
// Clock they read. It must not decide anything; scorers read it.
package load

import (
	"sync"
	"sync/atomic"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Tracker counts requests in flight per endpoint key: this replica's own, plus, when several
// replicas share their counts (SetRemote), the other replicas'. Safe for concurrent use.
type Tracker struct {
	counts   sync.Map // endpoint key -> *counter
	onChange atomic.Pointer[func(key string)]
	// gen counts the counters made and forgotten: what counterOf memoised on an endpoint
	// (its counter, or that it has none) holds while gen is unchanged.
	gen atomic.Uint64
}

// counterMemo keeps each endpoint's counter of a tracker on the endpoint.
var counterMemo = pool.NewMemo()

// counterOf is e's counter, nil when the endpoint was never counted; a pick reads it off the
// endpoint once it was looked up by key.
func (t *Tracker) counterOf(e *pool.Endpoint) *counter {
	gen := t.gen.Load() // before the lookup: a Forget after it makes the memo stale
	if v, ok := counterMemo.Load(e, t, gen); ok {
		return v.(*counter)
	}
	var c *counter
	if v, ok := t.counts.Load(e.Key()); ok {
		c = v.(*counter)
	}
	counterMemo.Store(e, t, gen, c) // nil too: making the counter bumps the generation
	return c
}

// InFlightOf is InFlight(e.Key()).
func (t *Tracker) InFlightOf(e *pool.Endpoint) int64 {
	if c := t.counterOf(e); c != nil {
		return c.total()
	}
	return 0
}

// LookupOf is Lookup(e.Key()).
func (t *Tracker) LookupOf(e *pool.Endpoint) (n int64, ok bool) {
	if c := t.counterOf(e); c != nil {
		return c.total(), true
	}
	return 0, false
}

type counter struct {
	local  atomic.Int64
	remote atomic.Int64 // the other replicas' requests, as last read
}

// total is this replica's requests and the other replicas'.
func (c *counter) total() int64 { return c.local.Load() + c.remote.Load() }

// NewTracker returns an empty tracker.
func NewTracker() *Tracker { return &Tracker{} }

func (t *Tracker) counter(key string) *counter {
	if c, ok := t.counts.Load(key); ok {
		return c.(*counter)
	}
	c, loaded := t.counts.LoadOrStore(key, new(counter))
	if !loaded {
		t.gen.Add(1) // after the store: see counterOf
	}
	return c.(*counter)
}

// OnChange makes the tracker call f(key) after each change of a local count (nil: none). f must
// not block: it runs on the request path.
func (t *Tracker) OnChange(f func(key string)) {
	if f == nil {
		t.onChange.Store(nil)
		return
	}
	t.onChange.Store(&f)
}

func (t *Tracker) changed(key string) {
	if f := t.onChange.Load(); f != nil {
		(*f)(key)
	}
}

// Start records one more request in flight on the endpoint and returns the function that
// ends it. The returned function is idempotent: calling it twice releases once.
func (t *Tracker) Start(key string) (done func()) {
	c := t.counter(key)
	c.local.Add(1)
	t.changed(key)
	var once sync.Once
	return func() {
		once.Do(func() {
			if c.local.Add(-1) < 0 {
				c.local.Store(0)
			}
			t.changed(key)
		})
	}
}

// InFlight is the number of requests currently in flight on the endpoint, this replica's and
// the other replicas'.
func (t *Tracker) InFlight(key string) int64 {
	if c, ok := t.counts.Load(key); ok {
		return c.(*counter).total()
	}
	return 0
}

// Local is this replica's own requests in flight on the endpoint (what it publishes).
func (t *Tracker) Local(key string) int64 {
	if c, ok := t.counts.Load(key); ok {
		return c.(*counter).local.Load()
	}
	return 0
}

// Lookup is InFlight plus whether the endpoint was ever counted (by any replica). The seed's
// policies treat an endpoint the gateway never saw ("no RealtimeNumRequestsRunning metric")
// differently from one at zero.
func (t *Tracker) Lookup(key string) (n int64, ok bool) {
	if c, ok := t.counts.Load(key); ok {
		return c.(*counter).total(), true
	}
	return 0, false
}

// SetRemote replaces the other replicas' counts: remote[key] for the keys it holds, 0 for every
// other key (nil: no remote counts at all, e.g. while Redis does not answer).
func (t *Tracker) SetRemote(remote map[string]int64) {
	t.counts.Range(func(k, c any) bool {
		if _, ok := remote[k.(string)]; !ok {
			c.(*counter).remote.Store(0)
		}
		return true
	})
	for k, n := range remote {
		t.counter(k).remote.Store(n)
	}
}

// Keys lists the endpoints with a counter.
func (t *Tracker) Keys() []string {
	var keys []string
	t.counts.Range(func(k, _ any) bool { keys = append(keys, k.(string)); return true })
	return keys
}

// Forget drops an endpoint's counter (when it leaves the pool).
func (t *Tracker) Forget(key string) {
	t.counts.Delete(key)
	t.gen.Add(1) // after the delete: see counterOf
}
