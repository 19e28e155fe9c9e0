package redisledger

import (
	"sync"
	"time"

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

// prefillShare is the bookkeeping of the shared prefill work: which endpoints changed since
// the last publish, which hold a field of ours in Redis, which the models asked about.
type prefillShare struct {
	mu      sync.Mutex
	dirty   map[string]struct{}
	mine    map[string]bool      // endpoints where Redis holds our field
	watched map[string]time.Time // endpoint → last asked about
}

func (p *prefillShare) init() {
	p.dirty, p.mine, p.watched = map[string]struct{}{}, map[string]bool{}, map[string]time.Time{}
}

func (p *prefillShare) markDirty(keys ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dirty == nil {
		return
	}
	for _, k := range keys {
		p.dirty[k] = struct{}{}
	}
}

// takeDirty returns the endpoints to publish: the changed ones, and with all every endpoint
// with a model that has work booked or still holds our field (so drained work is deleted
// and Redis is rebuilt after a restart).
func (p *prefillShare) takeDirty(all bool, m *latency.Models) []string {
	if m == nil {
		return nil
	}
	p.mu.Lock()
	out := make([]string, 0, len(p.dirty))
	for k := range p.dirty {
		out = append(out, k)
	}
	clear(p.dirty)
	mine := make(map[string]bool, len(p.mine))
	for k, v := range p.mine {
		mine[k] = v
	}
	p.mu.Unlock()
	if !all {
		return out
	}
	seen := make(map[string]bool, len(out))
	for _, k := range out {
		seen[k] = true
	}
	now := m.Now()
	for _, k := range m.Keys() {
		if seen[k] {
			continue
		}
		if backlog, _ := m.Local(k, now); backlog > 0 || mine[k] {
			out = append(out, k)
		}
	}
	return out
}

// published records whether Redis now holds our field for the endpoint.
func (p *prefillShare) published(k string, held bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if held {
		p.mine[k] = true
	} else {
		delete(p.mine, k)
	}
}

func (p *prefillShare) watch(k string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watched != nil {
		p.watched[k] = now
	}
}

// watchedKeys lists the endpoints asked about within watchTTL, forgetting the others.
func (p *prefillShare) watchedKeys(now time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.watched))
	for k, seen := range p.watched {
		if now.Sub(seen) > watchTTL {
			delete(p.watched, k)
			continue
		}
		out = append(out, k)
	}
	return out
}

func (s *Shared) markPrefillDirty(endpoint string) {
	s.pf.markDirty(endpoint)
	s.kickPublish()
}

// WatchPrefill makes the next reads include these endpoints' shared prefill work (a
// prediction does it for every endpoint it reads).
func (s *Shared) WatchPrefill(endpoints ...string) {
	now := s.o.Clock.Now()
	for _, k := range endpoints {
		s.pf.watch(k, now)
	}
}

// PrefillBacklog is the other live replicas' booked prefill seconds still ahead on the
// endpoint at now, as of the last successful read (each replica's drained by the time since
// the read). Zero when Redis is not answering or the read is older than the liveness window.
func (s *Shared) PrefillBacklog(endpoint string, now time.Time) float64 {
	s.pf.watch(endpoint, now)
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
