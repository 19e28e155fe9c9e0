package redisledger

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tandem-epp/tandem/internal/load"
)

// Signal is a per-key load signal, a few numbers per key, that every replica publishes and to
// which it adds the other live replicas' values: read in Refresh's one pipelined round trip,
// beside the decode ledger, and written in Publish's. Another signal is another Signal; the
// round trips do not change.
//
// Redis layout: one hash per key, <KeyPrefix><Name>:<key>, one field per replica holding its
// value as comma-separated numbers. A replica writes absolute values and deletes its field when
// its value drops to zero; fields of replicas that stopped heartbeating are ignored and pruned.
type Signal interface {
	// Name is the signal's segment of its Redis keys.
	Name() string
	// Keys are the keys to read (and the candidates to publish): the pool's endpoints.
	Keys() []string
	// Local is this replica's value for key; nil or all zeros when it has none.
	Local(key string) []float64
	// SetRemote hands over the sum of the other live replicas' values per key; nil when they
	// are unknown (Redis does not answer), and the signal must read as local only.
	SetRemote(sums map[string][]float64)
	// OnChange registers the function to call when key's local value changed (nil: none).
	OnChange(func(key string))
}

// signalState is a Signal with its publishing bookkeeping.
type signalState struct {
	Signal
	mu    sync.Mutex
	dirty map[string]struct{}
	// held are the keys this replica has a field for (only Publish touches it).
	held map[string]bool
}

func (s *Shared) signalKey(sig Signal, key string) string {
	return s.o.KeyPrefix + sig.Name() + ":" + key
}

func (st *signalState) markDirty(key string) {
	st.mu.Lock()
	st.dirty[key] = struct{}{}
	st.mu.Unlock()
}

func zero(v []float64) bool {
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}

func formatValue(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.FormatFloat(x, 'f', -1, 64)
	}
	return strings.Join(parts, ",")
}

// maxSignalValue bounds a value read from Redis: no replica counts more requests, or completes
// more per second, on one endpoint. Beyond it (or not finite) the field is not a replica's: int64
// of 1e300 or +Inf is a huge negative count.
const maxSignalValue = 1e9

func parseVector(s string) ([]float64, bool) {
	parts := strings.Split(s, ",")
	out := make([]float64, len(parts))
	for i, p := range parts {
		x, err := strconv.ParseFloat(p, 64)
		if err != nil || !(x >= 0 && x <= maxSignalValue) { // NaN fails both
			return nil, false
		}
		out[i] = x
	}
	return out, true
}

// queueSignalReads adds one HGETALL per key of every signal to pipe, and returns the keys read.
func (s *Shared) queueSignalReads(ctx context.Context, pipe redis.Pipeliner) ([][]string, [][]*redis.MapStringStringCmd) {
	keys := make([][]string, len(s.signals))
	out := make([][]*redis.MapStringStringCmd, len(s.signals))
	for i, st := range s.signals {
		keys[i] = st.Keys()
		cmds := make([]*redis.MapStringStringCmd, len(keys[i]))
		for j, k := range keys[i] {
			cmds[j] = pipe.HGetAll(ctx, s.signalKey(st, k))
		}
		out[i] = cmds
	}
	return keys, out
}

// applySignalReads sums the other live replicas' values per key and hands them to each signal.
// prune deletes a field whose replica is not live.
func (s *Shared) applySignalReads(keys [][]string, cmds [][]*redis.MapStringStringCmd, live map[string]bool, prune func(key, field string)) {
	for i, st := range s.signals {
		sums := map[string][]float64{}
		for j, k := range keys[i] {
			for field, val := range cmds[i][j].Val() {
				if field == s.o.ReplicaID {
					continue
				}
				if !live[field] {
					prune(s.signalKey(st, k), field)
					continue
				}
				v, ok := parseVector(val)
				if !ok {
					s.reject(RejectedSignal, 1)
					s.queuePrune(s.signalKey(st, k), field)
					continue
				}
				acc := sums[k]
				if len(acc) < len(v) {
					acc = append(acc, make([]float64, len(v)-len(acc))...)
				}
				for n, x := range v {
					acc[n] += x
				}
				sums[k] = acc
			}
		}
		st.SetRemote(sums)
	}
}

// queueSignalWrites adds to pipe this replica's changed values (every non-zero one when all is
// set) and returns, per signal, the keys written and the keys whose field it deletes (held until
// the pipeline succeeded; both are published again if it fails).
func (s *Shared) queueSignalWrites(ctx context.Context, pipe redis.Pipeliner, all bool, ttlMs int64) (written, deleted [][]string) {
	written, deleted = make([][]string, len(s.signals)), make([][]string, len(s.signals))
	for i, st := range s.signals {
		st.mu.Lock()
		keys := make(map[string]struct{}, len(st.dirty))
		for k := range st.dirty {
			keys[k] = struct{}{}
		}
		clear(st.dirty)
		st.mu.Unlock()
		if all {
			for k := range st.held {
				keys[k] = struct{}{}
			}
			for _, k := range st.Keys() {
				if !zero(st.Local(k)) {
					keys[k] = struct{}{}
				}
			}
		}
		for k := range keys {
			v := st.Local(k)
			key := s.signalKey(st, k)
			if zero(v) {
				if st.held[k] {
					pipe.HDel(ctx, key, s.o.ReplicaID)
					deleted[i] = append(deleted[i], k)
				}
				continue
			}
			pipe.HSet(ctx, key, s.o.ReplicaID, formatValue(v))
			pipe.PExpire(ctx, key, time.Duration(ttlMs)*time.Millisecond)
			st.held[k] = true
			written[i] = append(written[i], k)
		}
	}
	return written, deleted
}

// RequestCounts shares a replica's request-count signals per endpoint: requests running on it
// (the seed's RealtimeNumRequestsRunning, kept by the gateway), pending decodes, prefill requests
// in flight, and its drain rate (completions per second over the last minute). Every reader of
// the trackers (least_request, the load-imbalance fast paths, the combined overflow check, the
// policies' request counts) then sees the whole fleet's load. Nil trackers are not shared.
type RequestCounts struct {
	Running, Pending, Prefill *load.Tracker
	Drain                     *load.Rate
	// Endpoints lists the endpoint keys of the pool (read once per round trip).
	Endpoints func() []string
}

// Name implements Signal: AIBrix keeps its running-request counters under "rrq" too.
func (c *RequestCounts) Name() string { return "rrq" }

// Keys implements Signal.
func (c *RequestCounts) Keys() []string { return c.Endpoints() }

func (c *RequestCounts) trackers() []*load.Tracker {
	return []*load.Tracker{c.Running, c.Pending, c.Prefill}
}

// Local implements Signal: running, pending, prefill in flight, drain rate.
func (c *RequestCounts) Local(key string) []float64 {
	v := make([]float64, 4)
	for i, t := range c.trackers() {
		if t != nil {
			v[i] = float64(t.Local(key))
		}
	}
	if c.Drain != nil {
		v[3] = c.Drain.Local(key)
	}
	return v
}

// SetRemote implements Signal.
func (c *RequestCounts) SetRemote(sums map[string][]float64) {
	for i, t := range c.trackers() {
		if t == nil {
			continue
		}
		var m map[string]int64
		if sums != nil {
			m = make(map[string]int64, len(sums))
			for k, v := range sums {
				if i < len(v) && v[i] > 0 {
					m[k] = int64(v[i])
				}
			}
		}
		t.SetRemote(m)
	}
	if c.Drain != nil {
		var m map[string]float64
		if sums != nil {
			m = make(map[string]float64, len(sums))
			for k, v := range sums {
				if len(v) > 3 && v[3] > 0 {
					m[k] = v[3]
				}
			}
		}
		c.Drain.SetRemote(m)
	}
}

// OnChange implements Signal.
func (c *RequestCounts) OnChange(f func(key string)) {
	for _, t := range c.trackers() {
		if t != nil {
			t.OnChange(f)
		}
	}
}
