package picker

import (
	"context"
	"sync"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
)

// Deps are the shared, long-lived signals plugins and strategies read. One set per
// process; every strategy sees the same counters so their views of load agree.
type Deps struct {
	// Running counts requests in flight per destination endpoint (the seed's
	// RealtimeNumRequestsRunning, kept by the gateway).
	Running *load.Tracker
	// Drain is the per-endpoint rate of completed requests over the last minute.
	Drain   *load.Rate
	Metrics *metrics.Store
	// Prefix is the shared prefix index (the pd and prefix-cache strategies', and every
	// prefix-cache-scorer's without a producer); PrefixCache is the gateway's configuration
	// of it, the defaults of the prefix plugins.
	Prefix      *prefix.Index
	PrefixCache config.PrefixCache
	// Warmer, when set and running, applies prefix warms off the request path;
	// without it they are applied synchronously after the pick.
	Warmer *prefix.Warmer
	Clock  load.Clock
	// Outcomes records what happened to every routed request, one route each (Decision.Route):
	// the decisions' lifecycles write it, the ext_proc server reports into it first what only it
	// knows (give it this recorder: extproc.Options.Outcomes), and every reader reads it
	// (latency models, advisor, passive health, transfer proof). Nil records nothing.
	Outcomes *outcome.Recorder
	// Rand, when set, is the source of every random choice the strategies built on these
	// deps make (ties, random picks): a virtual-time simulation seeds it so a run is
	// reproducible. It is called inside picks, so a source that is not safe for concurrent
	// use must not serve concurrent picks. Nil (production) uses math/rand/v2's global source.
	Rand func(n int) int

	// forgets are the OnForget callbacks, called when endpoints depart (RetireDeparted).
	forgetMu sync.Mutex
	forgets  []func(live func(key string) bool)
}

// Keyed is per-endpoint state that can drop an endpoint's entry (load.Tracker, load.Rate).
type Keyed interface {
	Keys() []string
	Forget(key string)
}

// ForgetAbsent drops the entries of k whose endpoint live says has left.
func ForgetAbsent(k Keyed, live func(key string) bool) {
	for _, key := range k.Keys() {
		if !live(key) {
			k.Forget(key)
		}
	}
}

// OnForget registers f to run whenever the pool changes (RetireDeparted), with a test of which
// endpoints' state is still good: an endpoint in the pool that has not come back as another
// pod since the last run (a restart is forgotten once). Per-endpoint state outside the Deps (a
// strategy's own trackers, latency models) is pruned in the same place and at the same moment as
// the shared counters. f runs off the request path, concurrently with picks; it must not keep
// the test, which is about this change only.
func (d *Deps) OnForget(f func(live func(key string) bool)) {
	d.forgetMu.Lock()
	defer d.forgetMu.Unlock()
	d.forgets = append(d.forgets, f)
}

// RetireDeparted keeps the picks' per-endpoint state to the pool, off the request path: it
// watches store from now on and returns the loop to run (until ctx ends), which on every synced
// snapshot forgets the endpoints that are not in it and those whose pod changed (pool.Departures:
// left, came back at another address, or joined), so a pod that joins under a key another pod
// used — a restart, even after a gap in which that pod's last requests ended and counted again
// — inherits neither its affinity nor its counts nor its latency model. A request picked on the
// new snapshot before the pass runs is forgotten with them (its count is low until it ends).
// An unsynced snapshot (a source still listing, or one that lost its pool) forgets nothing
// until the next synced one. Without the loop, state is kept for every endpoint that was ever
// picked, and prefix blocks stay until they age out (AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS).
func (d *Deps) RetireDeparted(store *pool.Store) (run func(ctx context.Context)) {
	departures := store.WatchDepartures() // from now on, none lost however publishes coalesce
	changes := store.Changes()
	return func(ctx context.Context) {
		for {
			select {
			case <-ctx.Done():
				return
			case <-changes:
				if !store.Load().Synced {
					continue // its departures wait for the next synced snapshot
				}
				gone := departures.Take()
				// Loaded after the departures were taken: a publish in between leaves its
				// departures for the next pass and its endpoints live in this one.
				d.retire(store.Load(), gone)
			}
		}
	}
}

// retire drops the state of the endpoints not in snap or gone (departed or restarted since the
// last call): the prefix index's blocks of those gone, Running, Drain and whatever OnForget
// registered.
func (d *Deps) retire(snap *pool.Snapshot, gone map[string]struct{}) {
	live := func(key string) bool {
		if _, left := gone[key]; left {
			return false
		}
		return snap.Has(key)
	}
	if d.Prefix != nil && len(gone) > 0 {
		d.Prefix.ForgetAll(gone)
	}
	if d.Running != nil {
		ForgetAbsent(d.Running, live)
	}
	if d.Drain != nil {
		ForgetAbsent(d.Drain, live)
	}
	d.forgetMu.Lock()
	forgets := d.forgets
	d.forgetMu.Unlock()
	for _, f := range forgets {
		f(live)
	}
}

// NewDeps returns Deps with fresh counters, an empty metrics store and a prefix index
// bounded as pc says (zero fields take the index defaults), all reading clock (the system
// clock when nil). Set Warmer and run it to take prefix warming off the request path.
func NewDeps(clock load.Clock, pc config.PrefixCache) *Deps {
	if clock == nil {
		clock = load.SystemClock{}
	}
	return &Deps{
		Running:     load.NewTracker(),
		Drain:       load.NewRate(clock),
		Metrics:     metrics.NewStore(),
		Prefix:      prefix.NewIndex(prefix.Options{MaxBlocks: pc.MaxBlocks, Eviction: pc.EvictionDuration, Clock: clock}),
		PrefixCache: pc,
		Clock:       clock,
		Outcomes:    outcome.NewRecorder(clock),
	}
}

// WarmPrefix records that key now holds the prompt's blocks, off the request path when a
// Warmer runs.
func (d *Deps) WarmPrefix(model string, hashes []uint64, key string) {
	d.WarmIndex(d.Prefix, model, hashes, key, 0)
}

// WarmIndex is WarmPrefix into another index (a prefix producer's own), with the
// endpoint's block bound (0: the index's).
func (d *Deps) WarmIndex(ix *prefix.Index, model string, hashes []uint64, key string, capacity int) {
	if ix == nil || len(hashes) == 0 {
		return
	}
	if d.Warmer != nil {
		d.Warmer.WarmInto(ix, model, hashes, key, capacity)
		return
	}
	ix.AddCapped(model, hashes, key, capacity)
}
