package redisledger

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tandem-epp/tandem/internal/latency"
)

// Predicted prefill work shared across replicas. pd-predictive books each pick's predicted
// prefill seconds on a per-endpoint busy-until ledger (package latency); a replica that saw
// only its own picks would predict 1/N of the queue. Each replica publishes, per endpoint
// with booked work, when its own bookings there end (busy-until on the Redis clock, so
// clocks need not agree), in the same pipelines as the decode ledger; the reads fetch the
// other live replicas' busy-until of every endpoint the models asked about, and a prediction
// adds the work still ahead of each (their bookings are queued on the same engine, so their
// seconds add up). Values are absolute: a correction or an end is a rewrite, an endpoint
// whose work drained is an HDEL.

// prefillScript writes this replica's busy-until on one endpoint at Redis's own time.
// KEYS[1] endpoint key; ARGV id, seconds still ahead, key TTL ms.
const prefillScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.6f', now + tonumber(ARGV[2])))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`

func (s *Shared) prefillKey(endpoint string) string { return s.o.KeyPrefix + "pf:" + endpoint }

// bookedEndpoints lists the endpoints with prefill work booked by this replica (a full publish
// writes them whether they changed or not).
func (s *Shared) bookedEndpoints() []string {
	m := s.o.Latency
	now := m.Now()
	var out []string
	for _, k := range m.Keys() {
		if backlog, _ := m.Local(k, now); backlog > 0 {
			out = append(out, k)
		}
	}
	return out
}

// queuePrefillWrites adds to pipe this replica's busy-until on each endpoint, an HDEL where its
// work drained. A script, not HSET: busy-until is on Redis's clock.
func (s *Shared) queuePrefillWrites(ctx context.Context, pipe redis.Pipeliner, endpoints []string, ttlMs int64) {
	now := s.o.Clock.Now()
	s.pf.queueWrites(ctx, pipe, s.o.ReplicaID, endpoints, func(key, k string) bool {
		backlog, _ := s.o.Latency.Local(k, now)
		if backlog <= 0 {
			return false
		}
		pipe.Eval(ctx, prefillScript, []string{key}, s.o.ReplicaID, strconv.FormatFloat(backlog, 'f', 6, 64), ttlMs)
		return true
	})
}

// applyPrefillReads lists, per endpoint, each other live replica's booked seconds still ahead
// (a drained one, busy-until in the past, is well formed but adds nothing).
func (s *Shared) applyPrefillReads(rd *read, endpoints []string, cmds []*redis.MapStringStringCmd) map[string][]float64 {
	out := make(map[string][]float64, len(endpoints))
	s.pf.applyReads(rd, endpoints, cmds, RejectedPrefillBusyUntil, func(k, val string) bool {
		ahead, ok := parseBusyUntil(val, rd.rsec)
		if ok && ahead > 0 {
			out[k] = append(out[k], ahead)
		}
		return ok
	})
	return out
}

func (s *Shared) markPrefillDirty(endpoint string) {
	s.pf.markDirty(endpoint)
	s.kickPublish()
}

// WatchPrefill makes the next reads include these endpoints' shared prefill work (a
// prediction does it for every endpoint it reads).
func (s *Shared) WatchPrefill(endpoints ...string) {
	s.pf.watch(s.o.Clock.Now(), endpoints...)
}

// PrefillBacklog is the other live replicas' booked prefill seconds still ahead on the
// endpoint at now, as of the last successful read (each replica's drained by the time since
// the read). Zero when Redis is not answering or the read is older than the liveness window.
func (s *Shared) PrefillBacklog(endpoint string, now time.Time) float64 {
	s.pf.watch(now, endpoint)
	v := s.view.Load()
	if v == nil || now.Sub(v.at) > s.o.Liveness {
		return 0
	}
	since := max(now.Sub(v.at).Seconds(), 0)
	total := 0.0
	for _, ahead := range v.prefill[endpoint] {
		total += max(ahead-since, 0)
	}
	return total
}

// prefillRemote is the Shared store as the latency models' Remote.
type prefillRemote struct{ s *Shared }

func (r prefillRemote) Backlog(endpoint string, now time.Time) float64 {
	return r.s.PrefillBacklog(endpoint, now)
}

var _ latency.Remote = prefillRemote{}
