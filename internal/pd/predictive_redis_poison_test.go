package pd_test

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger/redistest"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// Values in Redis that no replica writes — busy-until of +Inf, NaN, -Inf and 1e300 from
// replicas that heartbeat, and a heartbeat dated a year ahead — written into a real
// redis-server beside a pd-predictive replica: every pick still routes a pair, each value is
// counted as rejected, and the poison goes away by itself (the far-future heartbeat is
// brought back to Redis's now plus the skew allowance, so it ages out like any other, and
// the fields of replicas that stopped heartbeating are deleted). Every key Tandem writes
// carries a TTL.
func TestSharedPoisonKeepsPredictiveRouting(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clock := load.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var eps []*pool.Endpoint
	for r, rs := range []string{"rs0", "rs1"} {
		for i, role := range []string{"prefill", "decode"} {
			eps = append(eps, pool.NewEndpoint("ns", role+"-"+rs, "10.7."+strconv.Itoa(r)+"."+strconv.Itoa(i+1), 8000, 0,
				map[string]string{pool.LabelRoleName: role, pool.LabelRolesetName: rs, pool.LabelModelName: "m"}, nil))
		}
	}
	snap := pool.NewStore().Publish(pool.Info{}, eps, true)
	gw := config.DefaultGateway()
	gw.DefaultStrategy = pd.StrategyPredictive
	p, err := app.BuildPicker(app.PickerOptions{Clock: clock, Gateway: gw, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	rejected := map[string]int{}
	prefix := "test:" + t.Name() + ":"
	const liveness, skew = 3 * time.Second, 200 * time.Millisecond
	s, err := redisledger.New(redisledger.Options{Addr: srv.Addr(), ReplicaID: "self", KeyPrefix: prefix, Clock: clock,
		Latency: p.Models, Liveness: liveness, HeartbeatSkew: skew, RefreshInterval: 20 * time.Millisecond, ReadTimeout: 2 * time.Second,
		PublishInterval: 50 * time.Millisecond, Rejected: func(kind string, n int) {
			mu.Lock()
			rejected[kind] += n
			mu.Unlock()
		}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	for _, e := range eps {
		s.WatchPrefill(e.Key())
	}
	rejectedOf := func(kind string) int {
		mu.Lock()
		defer mu.Unlock()
		return rejected[kind]
	}

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer func() { _ = rdb.Close() }()
	rnow, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	poison := map[string]string{"evil-inf": "inf", "evil-nan": "nan", "evil-neginf": "-inf", "evil-huge": "1e300"}
	for id, v := range poison {
		if err := rdb.ZAdd(ctx, prefix+"replicas", redis.Z{Score: float64(rnow.UnixMilli()), Member: id}).Err(); err != nil {
			t.Fatal(err)
		}
		for _, e := range eps {
			if err := rdb.HSet(ctx, prefix+"pf:"+e.Key(), id, v).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A heartbeat a year ahead, with a busy-until one second ahead on the first prefill pod.
	future := float64(rnow.Add(365 * 24 * time.Hour).UnixMilli())
	if err := rdb.ZAdd(ctx, prefix+"replicas", redis.Z{Score: future, Member: "evil-future"}).Err(); err != nil {
		t.Fatal(err)
	}
	until := float64(rnow.UnixNano())/1e9 + 1
	if err := rdb.HSet(ctx, prefix+"pf:"+eps[0].Key(), "evil-future", strconv.FormatFloat(until, 'f', 6, 64)).Err(); err != nil {
		t.Fatal(err)
	}

	// One read with every poisoned field live.
	if err := s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		d, err := p.Router.Schedule(ctx, completion(t, strings.Repeat("long ", 4000+i), map[string]string{wire.HeaderSLOTTFT: "5000"}), snap, snap.Endpoints)
		if err != nil {
			t.Fatalf("pick %d with poisoned shared values: %v", i, err)
		}
		for _, e := range eps {
			f := p.Models.Forecast(e.Key())
			if w := f.Wait(); w > 3600 {
				t.Fatalf("pick %d: predicted wait %.3g s on %s: a poisoned value was added", i, w, e.Key())
			}
		}
		d.Lifecycle.Done(nil)
	}
	if n := rejectedOf("prefill_busy_until"); n < len(poison)*len(eps) {
		t.Errorf("rejected busy-until values: %d, want at least %d (4 values on %d endpoints)", n, len(poison)*len(eps), len(eps))
	}
	if n := rejectedOf("heartbeat"); n < 1 {
		t.Errorf("rejected heartbeats: %d, want the one a year ahead counted", n)
	}

	// The poison expires: with the replica running, the far-future heartbeat is brought back
	// to now plus the skew allowance, and once the poisoning replicas are silent for the
	// liveness window their fields are deleted.
	began := time.Now()
	go s.Run(ctx)
	eventually(t, "the heartbeat a year ahead is brought back to Redis's now plus the skew allowance", func() bool {
		sc, err := rdb.ZScore(ctx, prefix+"replicas", "evil-future").Result()
		now, terr := rdb.Time(ctx).Result()
		return terr == nil && (err == redis.Nil || err == nil && sc <= float64(now.Add(skew).UnixMilli()))
	})
	eventually(t, "every poisoned field is deleted", func() bool {
		for _, e := range eps {
			fields, err := rdb.HKeys(ctx, prefix+"pf:"+e.Key()).Result()
			if err != nil {
				return false
			}
			for _, f := range fields {
				if strings.HasPrefix(f, "evil-") {
					return false
				}
			}
		}
		return true
	})
	t.Logf("rejected %v; poison gone %v after the replica started (liveness %v)", func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(rejected)
	}(), time.Since(began), liveness)
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if ttl, err := rdb.PTTL(ctx, k).Result(); err != nil || ttl <= 0 {
			t.Errorf("key %s has no TTL (%v, %v)", k, ttl, err)
		}
	}
	d, err := p.Router.Schedule(ctx, completion(t, strings.Repeat("long ", 4000), map[string]string{wire.HeaderSLOTTFT: "5000"}), snap, snap.Endpoints)
	if err != nil {
		t.Fatalf("pick after the poison expired: %v", err)
	}
	d.Lifecycle.Done(nil)
}

// eventually polls cond (a condition in Redis or of a background loop) for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
