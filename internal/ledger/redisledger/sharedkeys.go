package redisledger

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// sharedKeys is the bookkeeping every kind of per-key state shared through Redis needs (the
// decode ledger's pods, the booked prefill work's endpoints, each Signal's keys): which keys
// changed since the last publish, which hold this replica's field in Redis, which readers asked
// about lately; and the queueing of their writes and reads into the round trips' pipelines.
// What differs between the kinds stays with each: its Redis key, how a value is written (a
// script or HSET), and how another replica's field is parsed, bounded and summed.
//
// A nil *sharedKeys shares nothing (prefill work without latency models).
type sharedKeys[K comparable] struct {
	redisKey func(K) string

	mu      sync.Mutex
	dirty   map[K]struct{}
	mine    map[K]bool      // keys where Redis holds our field (as far as the writes queued tell)
	watched map[K]time.Time // key → last asked about
}

func newSharedKeys[K comparable](redisKey func(K) string) *sharedKeys[K] {
	return &sharedKeys[K]{redisKey: redisKey, dirty: map[K]struct{}{}, mine: map[K]bool{}, watched: map[K]time.Time{}}
}

// markDirty makes the next publish write these keys.
func (sk *sharedKeys[K]) markDirty(keys ...K) {
	if sk == nil {
		return
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	for _, k := range keys {
		sk.dirty[k] = struct{}{}
	}
}

// watch makes the next reads include these keys.
func (sk *sharedKeys[K]) watch(now time.Time, keys ...K) {
	if sk == nil {
		return
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	for _, k := range keys {
		sk.watched[k] = now
	}
}

// watchedKeys lists the keys asked about within watchTTL, forgetting the others.
func (sk *sharedKeys[K]) watchedKeys(now time.Time) []K {
	if sk == nil {
		return nil
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	out := make([]K, 0, len(sk.watched))
	for k, seen := range sk.watched {
		if now.Sub(seen) > watchTTL {
			delete(sk.watched, k)
			continue
		}
		out = append(out, k)
	}
	return out
}

// takeDirty returns the keys to publish and forgets that they changed: the changed ones, and
// with all also every key that holds our field (so drained values are deleted) and those of
// candidates (the keys that may have a value: Redis is rebuilt after a restart).
func (sk *sharedKeys[K]) takeDirty(all bool, candidates func() []K) []K {
	if sk == nil {
		return nil
	}
	sk.mu.Lock()
	keys := make(map[K]struct{}, len(sk.dirty))
	for k := range sk.dirty {
		keys[k] = struct{}{}
	}
	clear(sk.dirty)
	if all {
		for k := range sk.mine {
			keys[k] = struct{}{}
		}
	}
	sk.mu.Unlock()
	if all && candidates != nil {
		for _, k := range candidates() {
			keys[k] = struct{}{}
		}
	}
	out := make([]K, 0, len(keys))
	for k := range keys {
		out = append(out, k)
	}
	return out
}

// queueWrites adds to pipe this replica's value of every key: write queues it under the key's
// Redis key and reports true, or reports false, queueing nothing, when the value is zero; the
// field is then deleted (a replica writes absolute values, and no value is no field), whether
// or not mine says Redis holds it: a restored Redis or a lost reply may hold it behind our back,
// and deleting a field that is not there changes nothing.
func (sk *sharedKeys[K]) queueWrites(ctx context.Context, pipe redis.Pipeliner, replica string, keys []K,
	write func(key string, k K) bool) {
	if sk == nil {
		return
	}
	for _, k := range keys {
		key := sk.redisKey(k)
		held := write(key, k)
		if !held {
			pipe.HDel(ctx, key, replica)
		}
		sk.mu.Lock()
		if held {
			sk.mine[k] = true
		} else {
			delete(sk.mine, k)
		}
		sk.mu.Unlock()
	}
}

// published settles the writes of keys: when the pipeline failed they go out again with the
// next publish.
func (sk *sharedKeys[K]) published(keys []K, err error) {
	if err != nil {
		sk.markDirty(keys...)
	}
}

// queueReads adds one HGETALL per key to pipe.
func (sk *sharedKeys[K]) queueReads(ctx context.Context, pipe redis.Pipeliner, keys []K) []*redis.MapStringStringCmd {
	if sk == nil {
		return nil
	}
	cmds := make([]*redis.MapStringStringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HGetAll(ctx, sk.redisKey(k))
	}
	return cmds
}

// applyReads hands every other live replica's field of each key read to accept, which parses,
// bounds and sums it, and reports whether it was well formed. A field of a replica not live is
// pruned; a malformed one is counted as rejected (of kind) and pruned.
func (sk *sharedKeys[K]) applyReads(rd *read, keys []K, cmds []*redis.MapStringStringCmd, kind string,
	accept func(k K, val string) bool) {
	for i, k := range keys {
		for field, val := range cmds[i].Val() {
			if field == rd.s.o.ReplicaID {
				continue
			}
			if !rd.reps.live[field] {
				// Pruned only when every live replica was read: past MaxReplicas, the field's
				// replica may be live but unread.
				if rd.reps.unread == 0 {
					rd.s.queuePrune(sk.redisKey(k), field)
				}
				continue
			}
			if !accept(k, val) {
				rd.s.reject(kind, 1)
				rd.s.queuePrune(sk.redisKey(k), field)
			}
		}
	}
}

// read is one successful read round trip: the replica set as it saw it, and Redis's clock.
type read struct {
	s    *Shared
	reps liveReplicas
	rsec float64 // Redis's now, Unix seconds
}
