package redisledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tandem-epp/tandem/internal/ledger/redisledger"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger/redistest"
	"github.com/tandem-epp/tandem/internal/load"
)

// countsReplica is a replica sharing request counts only (no decode ledger).
type countsReplica struct {
	running, pending, prefill *load.Tracker
	drain                     *load.Rate
	sh                        *redisledger.Shared
}

func newCountsReplica(t *testing.T, addr, id string, keys ...string) *countsReplica {
	t.Helper()
	r := &countsReplica{running: load.NewTracker(), pending: load.NewTracker(), prefill: load.NewTracker(), drain: load.NewRate(nil)}
	sh, err := redisledger.New(redisledger.Options{Addr: addr, ReplicaID: id, KeyPrefix: "test:" + t.Name() + ":",
		Liveness: 400 * time.Millisecond, ReadTimeout: 100 * time.Millisecond,
		RefreshInterval: 20 * time.Millisecond, PublishInterval: 50 * time.Millisecond}, nil,
		&redisledger.RequestCounts{Running: r.running, Pending: r.pending, Prefill: r.prefill, Drain: r.drain,
			Endpoints: func() []string { return keys }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sh.Close() })
	r.sh = sh
	return r
}

// TestRequestCountsAcrossReplicas: two replicas share running, pending and prefill counts and
// drain rates per endpoint through a real Redis: each reads its own plus the other's, publishes
// only its own, goes local while Redis is down and shares again when it is back; a replica that
// stops (no heartbeat) no longer counts.
func TestRequestCountsAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const k = "ns/pod-0:8000"
	a, b := newCountsReplica(t, srv.Addr(), "A", k), newCountsReplica(t, srv.Addr(), "B", k)
	runA, cancelA := context.WithCancel(ctx)
	doneA, doneB := make(chan struct{}), make(chan struct{})
	go func() { a.sh.Run(runA); close(doneA) }()
	go func() { b.sh.Run(ctx); close(doneB) }()

	endA := a.running.Start(k)
	a.running.Start(k)
	a.pending.Start(k)
	a.prefill.Start(k)
	a.drain.Record(k)
	b.running.Start(k)
	eventually(t, "B sees A's counts beside its own", func() bool {
		return b.running.InFlight(k) == 3 && b.pending.InFlight(k) == 1 && b.prefill.InFlight(k) == 1 &&
			b.drain.PerSecond(k) == 1.0/60 && b.running.Local(k) == 1
	})
	eventually(t, "A sees B's running request", func() bool { return a.running.InFlight(k) == 3 && a.running.Local(k) == 2 })
	endA()
	eventually(t, "a release reaches B", func() bool { return b.running.InFlight(k) == 2 })

	srv.Kill()
	eventually(t, "B counts only its own while Redis is down", func() bool {
		return b.running.InFlight(k) == 1 && b.pending.InFlight(k) == 0 && b.drain.PerSecond(k) == 0
	})
	srv.Start()
	eventually(t, "B sees A's counts again", func() bool { return b.running.InFlight(k) == 2 && b.pending.InFlight(k) == 1 })

	cancelA() // A stops heartbeating; its fields stay in Redis until pruned
	<-doneA
	eventually(t, "A's counts stop counting once its heartbeat is older than the liveness window",
		func() bool { return b.running.InFlight(k) == 1 && b.pending.InFlight(k) == 0 })
	cancel()
	<-doneB
}

// TestRequestCountsRefuseMalformedValues: a value in Redis that no replica writes (not finite,
// or far beyond any request count: a foreign writer, a corrupted key) is ignored and deleted, not summed:
// int64 of 1e300 or +Inf is a huge negative count, which would make every reader's
// least-request scoring prefer the endpoint without bound.
func TestRequestCountsRefuseMalformedValues(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const k = "ns/pod-0:8000"
	b, c := newCountsReplica(t, srv.Addr(), "B", k), newCountsReplica(t, srv.Addr(), "C", k)
	go b.sh.Run(ctx)
	go c.sh.Run(ctx) // C heartbeats, so its field is read
	b.running.Start(k)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer func() { _ = rdb.Close() }()
	key := "test:" + t.Name() + ":rrq:" + k
	for _, v := range []string{"1e300,1e300,1e300,1e300", "+Inf,+Inf,+Inf,+Inf", "NaN,NaN,NaN,NaN", "1,1,1,1"} {
		if err := rdb.HSet(ctx, key, "C", v).Err(); err != nil {
			t.Fatal(err)
		}
		if v == "1,1,1,1" {
			eventually(t, "B adds C's well-formed counts", func() bool { return b.running.InFlight(k) == 2 && b.drain.PerSecond(k) == 1 })
			continue
		}
		// B refuses the field and deletes it (the poison does not stay).
		eventually(t, "B deletes C's malformed field "+v, func() bool {
			n, err := rdb.HExists(ctx, key, "C").Result()
			return err == nil && !n
		})
		if n := b.running.InFlight(k); n != 1 {
			t.Errorf("C's field %q: B reads %d requests running, want its own 1", v, n)
		}
		if r := b.drain.PerSecond(k); r != 0 {
			t.Errorf("C's field %q: B reads a drain rate of %v, want 0", v, r)
		}
	}
}
