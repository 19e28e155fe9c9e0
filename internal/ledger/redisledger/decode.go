package redisledger

import (
	"context"
	"math"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tandem-epp/tandem/internal/ledger"
)

// The decode token ledger shared across replicas: per decode pod, each replica's outstanding
// tokens, requests and Σ routed_at (the layout and the clock are described in shared.go).

func (s *Shared) markDirty(p ledger.Pod) {
	s.pods.markDirty(p)
	s.kickPublish()
}

func (s *Shared) podKey(p ledger.Pod) string { return s.o.KeyPrefix + p.String() }

// Remote implements ledger.Remote: the other live replicas' charges on p as of the last
// successful read, their elapsed time carried forward to now. Zero when Redis is not
// answering or the last read is older than the liveness window. It also asks the next
// reads to include p.
func (s *Shared) Remote(p ledger.Pod) ledger.RemoteLoad {
	now := s.o.Clock.Now()
	s.pods.watch(now, p)
	v := s.view.Load()
	if v == nil || now.Sub(v.at) > s.o.Liveness {
		return ledger.RemoteLoad{}
	}
	r := v.pods[p]
	if d := now.Sub(v.at).Seconds(); d > 0 {
		r.Elapsed += float64(r.Count) * d
	}
	return r
}

// Watch makes the next reads include these pods (Remote does it for every pod it scores).
func (s *Shared) Watch(pods ...ledger.Pod) {
	s.pods.watch(s.o.Clock.Now(), pods...)
}

// publishScript writes one pod's field with sumAt on the Redis clock.
// KEYS[1] pod key; ARGV id, tokens, count, local Σ elapsed seconds, key TTL ms.
const publishScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local sum = tonumber(ARGV[3]) * now - tonumber(ARGV[4])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ',' .. ARGV[3] .. ',' .. string.format('%.6f', sum))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1`

// queueDecodeWrites adds to pipe this replica's charges on each pod, an HDEL where it has none.
// A script, not HSET: sumAt is computed on Redis's clock.
func (s *Shared) queueDecodeWrites(ctx context.Context, pipe redis.Pipeliner, pods []ledger.Pod, ttlMs int64) {
	s.pods.queueWrites(ctx, pipe, s.o.ReplicaID, pods, func(key string, p ledger.Pod) bool {
		tokens, count, elapsed := s.dec.Local(p)
		if count == 0 && tokens == 0 {
			return false
		}
		pipe.Eval(ctx, publishScript, []string{key}, s.o.ReplicaID,
			strconv.FormatFloat(tokens, 'f', -1, 64), count, strconv.FormatFloat(elapsed, 'f', 6, 64), ttlMs)
		return true
	})
}

// applyDecodeReads sums the other live replicas' charges per pod. Unlike the other kinds, a
// charge is bounded against Redis's now (its requests' age, from sumAt), so parseValue alone
// cannot accept it.
func (s *Shared) applyDecodeReads(rd *read, pods []ledger.Pod, cmds []*redis.MapStringStringCmd) map[ledger.Pod]ledger.RemoteLoad {
	out := make(map[ledger.Pod]ledger.RemoteLoad, len(pods))
	s.pods.applyReads(rd, pods, cmds, RejectedDecodeCharge, func(p ledger.Pod, val string) bool {
		tokens, count, sumAt, ok := parseValue(val)
		elapsed := float64(count)*rd.rsec - sumAt
		if !ok || elapsed > float64(count)*maxRequestAge {
			return false
		}
		acc := out[p]
		acc.Tokens += tokens
		acc.Count += count
		acc.Elapsed += max(elapsed, 0)
		out[p] = acc
		return true
	})
	for p, acc := range out {
		if acc.Count == 0 && acc.Tokens == 0 {
			delete(out, p) // nothing outstanding: no elapsed time either
		}
	}
	return out
}

func parseValue(v string) (tokens float64, count int64, sumAt float64, ok bool) {
	f := strings.Split(v, ",")
	if len(f) != 3 {
		return 0, 0, 0, false
	}
	var e1, e2, e3 error
	tokens, e1 = strconv.ParseFloat(f[0], 64)
	count, e2 = strconv.ParseInt(f[1], 10, 64)
	sumAt, e3 = strconv.ParseFloat(f[2], 64)
	ok = e1 == nil && e2 == nil && e3 == nil &&
		tokens >= 0 && tokens <= maxLedgerTokens && // NaN fails both; +Inf the bound
		count >= 0 && count <= maxSignalValue &&
		!math.IsNaN(sumAt) && !math.IsInf(sumAt, 0)
	return tokens, count, sumAt, ok
}

// maxRequestAge bounds the age of a replica's outstanding decode requests, in seconds, read
// from its sumAt: no request decodes for a day. Beyond it the field is no replica's.
const maxRequestAge = 24 * 3600

// maxLedgerTokens bounds a replica's published decode tokens for one pod: far above any real
// KV cache (a 1e12-token pod does not exist), low enough that a malformed or hostile field
// cannot make the sum infinite and exclude the pod.
const maxLedgerTokens = 1e12
