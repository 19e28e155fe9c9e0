package redisledger

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/load"
)

// Redis layout (KeyPrefix defaults to "tandem:dtl:"):
//
//	<prefix>replicas        sorted set: replica ID → last heartbeat, Redis clock, Unix ms
//	                        (one in the future beyond HeartbeatSkew is rewritten to now +
//	                        HeartbeatSkew; a read takes at most MaxReplicas of the live ones)
//	<prefix><ns>/<pod>      hash per decode pod: replica ID → "tokens,count,sumAt"
//	<prefix>pf:<endpoint>   hash per endpoint with booked prefill work (pd-predictive's
//	                        busy-until ledger): replica ID → busy-until, Unix seconds on the
//	                        Redis clock
//
// sumAt is Σ routed_at of the replica's outstanding requests on the pod, in Unix seconds on
// the Redis clock: the publisher sends its local Σ(now − routed_at) and a script turns it
// into count·TIME − elapsed inside Redis, and a reader computes count·TIME − sumAt. Every
// time is Redis's, so replicas' clocks (or a simulation's virtual clock) never need to agree.
// Values are absolute, never deltas: a replica rewrites its whole field, and a field of a
// replica that stopped heartbeating is ignored and pruned.
//
// Nothing read from Redis is trusted: every number must be finite and inside the bound its
// parser documents (parseValue, parseVector, parseBusyUntil, parseLive), or the field is
// ignored, counted (Options.Rejected, tandem_redis_values_rejected_total{kind}) and deleted. Every
// key Tandem writes carries a TTL (KeyTTL), renewed with each write.

// Defaults.
const (
	DefaultKeyPrefix       = "tandem:dtl:"
	DefaultReadTimeout     = 100 * time.Millisecond
	DefaultRefreshInterval = 250 * time.Millisecond
	DefaultPublishInterval = time.Second
	DefaultLiveness        = 3 * time.Second
	DefaultKeyTTL          = 10 * time.Minute
	// DefaultHeartbeatSkew is how far ahead of Redis's clock a heartbeat may be (a replica
	// writes Redis's own TIME, so only a foreign writer is further ahead).
	DefaultHeartbeatSkew = time.Second
	// DefaultMaxReplicas bounds the live replicas one read takes from the replica set, so a
	// flood of fake replicas cannot make every read time out (and switch sharing off).
	DefaultMaxReplicas = 1024
	// watchTTL: a pod nobody scored for this long is no longer read from Redis.
	watchTTL = 10 * time.Minute
)

// Options configure a shared ledger.
type Options struct {
	Addr          string // host:port (--redis-addr, $TANDEM_REDIS_ADDR)
	Password      string // --redis-password, $TANDEM_REDIS_PASSWORD
	TLS           bool   // --redis-tls, $TANDEM_REDIS_TLS
	TLSSkipVerify bool   // --redis-tls-insecure-skip-verify

	// ReplicaID names this replica; default "<hostname>:<start unix ns>", unique per process.
	ReplicaID string
	KeyPrefix string
	// ReadTimeout bounds one read round trip (default 100 ms); RefreshInterval is how often
	// other replicas' charges are read (default 250 ms); PublishInterval how often every
	// non-zero pod is republished and the heartbeat renewed (default 1 s); a replica whose
	// heartbeat is older than Liveness (default 3 s) is dead; KeyTTL is the PEXPIRE of the
	// keys (default 10 min).
	ReadTimeout     time.Duration
	RefreshInterval time.Duration
	PublishInterval time.Duration
	Liveness        time.Duration
	KeyTTL          time.Duration
	// HeartbeatSkew: a heartbeat further ahead of Redis's clock counts as now + HeartbeatSkew
	// (default 1 s) and is rewritten so, so it ages out like any other. MaxReplicas bounds
	// the live replicas one read takes, newest first (default 1024).
	HeartbeatSkew time.Duration
	MaxReplicas   int
	// Rejected, when set, is told of values read from Redis that were refused: n of a kind
	// (RejectedKinds).
	Rejected func(kind string, n int)

	Clock  load.Clock // the decode ledger's clock; default the system clock
	Logger logr.Logger

	// Latency, when set, are the online latency models whose predicted prefill work
	// (busy-until per endpoint) is shared in the same round trips: each replica's predicted
	// waits then include the prefills the others booked.
	Latency *latency.Models
}

func (o *Options) defaults() error {
	if o.Addr == "" {
		return errors.New("redis address is empty: set --redis-addr (or $TANDEM_REDIS_ADDR) to host:port")
	}
	if _, _, err := net.SplitHostPort(o.Addr); err != nil {
		return fmt.Errorf("--redis-addr=%q: want host:port (%v)", o.Addr, err)
	}
	if o.ReplicaID == "" {
		host, _ := os.Hostname()
		if p := os.Getenv("POD_NAME"); p != "" {
			host = p
		}
		o.ReplicaID = host + ":" + strconv.FormatInt(time.Now().UnixNano(), 10)
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	set := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	set(&o.ReadTimeout, DefaultReadTimeout)
	set(&o.RefreshInterval, DefaultRefreshInterval)
	set(&o.PublishInterval, DefaultPublishInterval)
	set(&o.Liveness, DefaultLiveness)
	set(&o.KeyTTL, DefaultKeyTTL)
	set(&o.HeartbeatSkew, DefaultHeartbeatSkew)
	if o.MaxReplicas <= 0 {
		o.MaxReplicas = DefaultMaxReplicas
	}
	if o.Clock == nil {
		o.Clock = load.SystemClock{}
	}
	return nil
}

var quietOnce sync.Once

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// Shared publishes a decode ledger's charges and serves the other replicas' charges to it
// (it is the ledger's Remote), and does the same for every Signal (request counts), in the same
// round trips. Safe for concurrent use.
type Shared struct {
	o       Options
	rdb     *redis.Client
	dec     *ledger.Decode // nil: the decode ledger stays local (signals only)
	pods    *sharedKeys[ledger.Pod]
	signals []*signalState
	pf      *sharedKeys[string] // Options.Latency's booked prefill work; nil without it

	kick chan struct{}

	view    atomic.Pointer[view]
	healthy atomic.Bool

	pruneMu sync.Mutex
	prune   map[string][]string // key → dead replicas' fields to delete
}

type view struct {
	at   time.Time // local clock when read
	pods map[ledger.Pod]ledger.RemoteLoad
	// prefill is, per endpoint, each other live replica's booked prefill seconds still
	// ahead at the read.
	prefill map[string][]float64
}

// New connects dec (nil: none), the signals and Options.Latency's booked prefill work to Redis
// (lazily: nothing is dialled until the first round trip) and makes them add the other
// replicas' values. Call Run to publish and read in the background.
func New(o Options, dec *ledger.Decode, signals ...Signal) (*Shared, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	// go-redis logs every failed dial; Shared logs an outage once (health) instead.
	quietOnce.Do(func() { redis.SetLogger(quietLogger{}) })
	ro := &redis.Options{Addr: o.Addr, Password: o.Password, Protocol: 2, DisableIdentity: true,
		DialTimeout: 2 * o.ReadTimeout, ReadTimeout: 2 * o.ReadTimeout, WriteTimeout: 2 * o.ReadTimeout,
		MaxRetries: -1, ContextTimeoutEnabled: true, PoolSize: 4}
	if o.TLS {
		host, _, _ := net.SplitHostPort(o.Addr)
		ro.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host, InsecureSkipVerify: o.TLSSkipVerify} //nolint:gosec // opt-in flag
	}
	s := &Shared{o: o, rdb: redis.NewClient(ro), dec: dec, kick: make(chan struct{}, 1), prune: map[string][]string{}}
	s.pods = newSharedKeys(s.podKey)
	s.healthy.Store(true)
	if dec != nil {
		dec.OnChange(s.markDirty)
		dec.SetRemote(s)
	}
	for _, sig := range signals {
		st := &signalState{Signal: sig}
		st.keys = newSharedKeys(func(key string) string { return s.signalKey(sig, key) })
		sig.OnChange(func(key string) {
			st.keys.markDirty(key)
			s.kickPublish()
		})
		s.signals = append(s.signals, st)
	}
	if o.Latency != nil {
		s.pf = newSharedKeys(s.prefillKey)
		o.Latency.OnCharge(s.markPrefillDirty)
		o.Latency.SetRemote(prefillRemote{s})
	}
	return s, nil
}

// ReplicaID is this replica's field name in Redis.
func (s *Shared) ReplicaID() string { return s.o.ReplicaID }

// Close detaches the ledger and the signals (back to local scoring) and closes the connection.
func (s *Shared) Close() error {
	if s.dec != nil {
		s.dec.SetRemote(nil)
		s.dec.OnChange(nil)
	}
	for _, st := range s.signals {
		st.OnChange(nil)
		st.SetRemote(nil)
	}
	if s.o.Latency != nil {
		s.o.Latency.SetRemote(nil)
		s.o.Latency.OnCharge(nil)
	}
	return s.rdb.Close()
}

func (s *Shared) kickPublish() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// dropRemote makes the ledger and the signals local-only (an outage).
func (s *Shared) dropRemote() {
	s.view.Store(nil)
	for _, st := range s.signals {
		st.SetRemote(nil)
	}
}

func (s *Shared) replicasKey() string { return s.o.KeyPrefix + "replicas" }

// heartbeatScript renews this replica's heartbeat at Redis's own time, brings heartbeats
// dated beyond the skew allowance back to now + skew (a bounded number per call), and drops
// replicas silent for ten liveness windows. KEYS[1] replicas; ARGV id, key TTL ms, prune age
// ms, skew ms.
const heartbeatScript = `
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = ms + tonumber(ARGV[4])
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. cap, '+inf', 'LIMIT', 0, 256)) do
  redis.call('ZADD', KEYS[1], cap, m)
end
redis.call('ZADD', KEYS[1], ms, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - tonumber(ARGV[3]))
return ms`

// liveScript reads Redis's clock, how many replicas heartbeat within the liveness window, and
// at most ARGV[2] of them, newest first, with their heartbeats. KEYS[1] replicas; ARGV
// liveness ms, max replicas.
const liveScript = `
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local from = ms - tonumber(ARGV[1])
local n = redis.call('ZCOUNT', KEYS[1], from, '+inf')
local live = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', from, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
return {t[1], t[2], n, live}`

// health logs transitions between answering and not answering.
func (s *Shared) health(err error, what string) {
	if err == nil {
		if s.healthy.CompareAndSwap(false, true) {
			s.o.Logger.Info("shared decode ledger: Redis answers again; adding other replicas' charges", "addr", s.o.Addr)
		}
		return
	}
	if s.healthy.CompareAndSwap(true, false) {
		s.o.Logger.Error(err, "shared decode ledger: Redis is not answering; scoring from the local ledger until it does",
			"addr", s.o.Addr, "during", what)
	}
}

// Refresh reads the live replicas, the other replicas' charges on every watched pod and every
// signal's values in one pipelined round trip bounded by ReadTimeout. On failure the view is
// dropped (local scoring) and the error returned.
func (s *Shared) Refresh(ctx context.Context) error {
	now := s.o.Clock.Now()
	pods, pfKeys := s.pods.watchedKeys(now), s.pf.watchedKeys(now)

	ctx, cancel := context.WithTimeout(ctx, s.o.ReadTimeout)
	defer cancel()
	pipe := s.rdb.Pipeline()
	lcmd := pipe.Eval(ctx, liveScript, []string{s.replicasKey()}, s.o.Liveness.Milliseconds(), s.o.MaxReplicas)
	podCmds := s.pods.queueReads(ctx, pipe, pods)
	sigKeys, sigCmds := s.queueSignalReads(ctx, pipe)
	pfCmds := s.pf.queueReads(ctx, pipe, pfKeys)
	_, err := pipe.Exec(ctx)
	if err != nil && !errors.Is(err, redis.Nil) {
		s.dropRemote()
		s.health(err, "read")
		return fmt.Errorf("shared decode ledger read: %w", err)
	}
	reps, err := parseLive(lcmd.Val(), s.o.HeartbeatSkew)
	if err != nil {
		s.dropRemote()
		s.health(err, "read")
		return fmt.Errorf("shared decode ledger read: %w", err)
	}
	s.health(nil, "read")
	s.reject(RejectedHeartbeat, reps.future)
	s.reject(RejectedReplicas, reps.unread)
	rd := &read{s: s, reps: reps, rsec: float64(reps.now.UnixNano()) / 1e9}
	s.view.Store(&view{at: now, pods: s.applyDecodeReads(rd, pods, podCmds), prefill: s.applyPrefillReads(rd, pfKeys, pfCmds)})
	s.applySignalReads(rd, sigKeys, sigCmds)
	return nil
}

// reject counts n values of a kind refused on a read.
func (s *Shared) reject(kind string, n int) {
	if s.o.Rejected != nil && n > 0 {
		s.o.Rejected(kind, n)
	}
}

func (s *Shared) queuePrune(key, field string) {
	s.pruneMu.Lock()
	s.prune[key] = append(s.prune[key], field)
	s.pruneMu.Unlock()
}

// Publish writes the pods whose ledger changed since the last publish (all pods the ledger
// holds, or where Redis holds our field, when all is set), the signals' and the prefill work's
// changes likewise, and renews the heartbeat, in one pipeline. Keys that fail to publish stay
// dirty and go out with the next attempt.
func (s *Shared) Publish(ctx context.Context, all bool) error {
	var ledgerPods func() []ledger.Pod
	if s.dec != nil {
		ledgerPods = s.dec.Pods
	}
	pods := s.pods.takeDirty(all, ledgerPods)
	sigKeys := s.takeSignalsDirty(all)
	pfKeys := s.pf.takeDirty(all, s.bookedEndpoints)
	s.pruneMu.Lock()
	prune := s.prune
	s.prune = map[string][]string{}
	s.pruneMu.Unlock()

	ttlMs := s.o.KeyTTL.Milliseconds()
	ctx, cancel := context.WithTimeout(ctx, 5*s.o.ReadTimeout)
	defer cancel()
	pipe := s.rdb.Pipeline()
	pipe.Eval(ctx, heartbeatScript, []string{s.replicasKey()}, s.o.ReplicaID, ttlMs, (10 * s.o.Liveness).Milliseconds(),
		s.o.HeartbeatSkew.Milliseconds())
	s.queueDecodeWrites(ctx, pipe, pods, ttlMs)
	s.queueSignalWrites(ctx, pipe, sigKeys, ttlMs)
	s.queuePrefillWrites(ctx, pipe, pfKeys, ttlMs)
	for key, fields := range prune {
		pipe.HDel(ctx, key, fields...)
	}
	_, err := pipe.Exec(ctx)
	s.health(err, "publish")
	s.pods.published(pods, err)
	for i, st := range s.signals {
		st.keys.published(sigKeys[i], err)
	}
	s.pf.published(pfKeys, err)
	if err != nil {
		return fmt.Errorf("shared decode ledger publish: %w", err)
	}
	return nil
}

// Run publishes changes as they happen (coalesced: one pipeline at a time), republishes
// everything with the heartbeat every PublishInterval and reads the other replicas every
// RefreshInterval, until ctx ends. Errors are logged once per outage and retried.
func (s *Shared) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(s.o.RefreshInterval)
		defer t.Stop()
		for {
			_ = s.Refresh(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	wg.Go(func() {
		t := time.NewTicker(s.o.PublishInterval)
		defer t.Stop()
		_ = s.Publish(ctx, true)
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.kick:
				_ = s.Publish(ctx, false)
			case <-t.C:
				_ = s.Publish(ctx, true)
			}
		}
	})
	wg.Wait()
}
