package redisledger

import (
	"context"
	"strconv"
	"strings"
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
	keys *sharedKeys[string]
}

func (s *Shared) signalKey(sig Signal, key string) string {
	return s.o.KeyPrefix + sig.Name() + ":" + key
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
// Unlike the decode ledger and the prefill work, a signal reads every key it has, not those
// asked about: its readers (least_request, the fast paths) look at the whole pool.
func (s *Shared) queueSignalReads(ctx context.Context, pipe redis.Pipeliner) ([][]string, [][]*redis.MapStringStringCmd) {
	keys := make([][]string, len(s.signals))
	out := make([][]*redis.MapStringStringCmd, len(s.signals))
	for i, st := range s.signals {
		keys[i] = st.Keys()
		out[i] = st.keys.queueReads(ctx, pipe, keys[i])
	}
	return keys, out
}

// applySignalReads sums the other live replicas' values per key and hands them to each signal.
func (s *Shared) applySignalReads(rd *read, keys [][]string, cmds [][]*redis.MapStringStringCmd) {
	for i, st := range s.signals {
		sums := map[string][]float64{}
		st.keys.applyReads(rd, keys[i], cmds[i], RejectedSignal, func(k, val string) bool {
			v, ok := parseVector(val)
			if !ok {
				return false
			}
			acc := sums[k]
			if len(acc) < len(v) {
				acc = append(acc, make([]float64, len(v)-len(acc))...)
			}
			for n, x := range v {
				acc[n] += x
			}
			sums[k] = acc
			return true
		})
		st.SetRemote(sums)
	}
}

// takeSignalsDirty returns, per signal, the keys to publish: the changed ones, and with all
// every non-zero one and every one holding our field.
func (s *Shared) takeSignalsDirty(all bool) [][]string {
	out := make([][]string, len(s.signals))
	for i, st := range s.signals {
		out[i] = st.keys.takeDirty(all, func() []string {
			var nonZero []string
			for _, k := range st.Keys() {
				if !zero(st.Local(k)) {
					nonZero = append(nonZero, k)
				}
			}
			return nonZero
		})
	}
	return out
}

// queueSignalWrites adds to pipe this replica's values of the keys, per signal. Plain HSET and
// PEXPIRE, no script: a signal's value needs no clock of Redis's.
func (s *Shared) queueSignalWrites(ctx context.Context, pipe redis.Pipeliner, keys [][]string, ttlMs int64) {
	for i, st := range s.signals {
		st.keys.queueWrites(ctx, pipe, s.o.ReplicaID, keys[i], func(key, k string) bool {
			v := st.Local(k)
			if zero(v) {
				return false
			}
			pipe.HSet(ctx, key, s.o.ReplicaID, formatValue(v))
			pipe.PExpire(ctx, key, time.Duration(ttlMs)*time.Millisecond)
			return true
		})
	}
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
