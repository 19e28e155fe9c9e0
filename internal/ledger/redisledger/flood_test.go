package redisledger_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger/redistest"
)

// 300,000 fake replicas heartbeating in a real Redis: every read still answers within the
// default 100 ms read timeout (sharing stays on), the replicas past the per-read bound are
// counted as rejected, a real replica that heartbeats is still read, and no field of a replica
// that may be live but was not read is deleted.
func TestReplicaFloodKeepsSharingOn(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	var mu sync.Mutex
	rejected := map[string]int{}
	count := func(kind string, n int) {
		mu.Lock()
		rejected[kind] += n
		mu.Unlock()
	}
	a := newReplica(t, srv.Addr(), "A", func(o *redisledger.Options) { o.Liveness = time.Minute })
	b := newReplica(t, srv.Addr(), "B", func(o *redisledger.Options) {
		o.Liveness, o.Rejected, o.ReadTimeout = time.Minute, count, redisledger.DefaultReadTimeout
	})
	d := ledger.Pod{Namespace: "ns", Name: "decode-0"}
	b.sh.Watch(d)

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer func() { _ = rdb.Close() }()
	rnow, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	const fakes = 300_000
	key := "test:" + t.Name() + ":replicas"
	for start := 0; start < fakes; start += 10_000 {
		zs := make([]redis.Z, 0, 10_000)
		for i := start; i < start+10_000; i++ {
			zs = append(zs, redis.Z{Score: float64(rnow.UnixMilli()), Member: "fake-" + strconv.Itoa(i)})
		}
		if err := rdb.ZAdd(ctx, key, zs...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// A field of a fake replica on the pod: live, but past the bound, so not read, and not
	// deleted either (it may belong to a live replica).
	if err := rdb.HSet(ctx, "test:"+t.Name()+":ns/decode-0", "fake-7", "100,1,"+strconv.FormatInt(rnow.Unix(), 10)).Err(); err != nil {
		t.Fatal(err)
	}

	// A charges the pod and heartbeats after the fakes: it is among the newest.
	a.dec.Acquire(d, 5000, 0)
	if err := a.sh.Publish(ctx, false); err != nil {
		t.Fatal(err)
	}
	var slowest time.Duration
	for range 5 {
		begin := time.Now()
		if err := b.sh.Refresh(ctx); err != nil {
			t.Fatalf("a read with %d fake replicas failed: %v", fakes, err)
		}
		slowest = max(slowest, time.Since(begin))
	}
	t.Logf("slowest of 5 reads with %d fake replicas: %v", fakes, slowest)
	if r := b.sh.Remote(d); r.Tokens != 5000 || r.Count != 1 {
		t.Fatalf("B sees %+v on the pod, want A's 5000 tokens, 1 request", r)
	}
	mu.Lock()
	n := rejected[redisledger.RejectedReplicas]
	mu.Unlock()
	if want := 5 * (fakes + 1 - redisledger.DefaultMaxReplicas); n != want {
		t.Errorf("rejected replicas: %d, want %d (5 reads × the live replicas past %d)", n, want, redisledger.DefaultMaxReplicas)
	}
	if err := b.sh.Publish(ctx, false); err != nil {
		t.Fatal(err)
	}
	if ok, err := rdb.HExists(ctx, "test:"+t.Name()+":ns/decode-0", "fake-7").Result(); err != nil || !ok {
		t.Errorf("the unread replica's field was deleted (%v, %v)", ok, err)
	}
}
