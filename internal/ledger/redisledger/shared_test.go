package redisledger_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger/redistest"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/outcome"
)

var t0 = time.Unix(1_700_000_000, 0)

type replica struct {
	clock *load.ManualClock
	dec   *ledger.Decode
	sh    *redisledger.Shared
}

func newReplica(t *testing.T, addr, id string, mut func(*redisledger.Options)) *replica {
	t.Helper()
	clock := load.NewManualClock(t0)
	dec := ledger.NewDecode(ledger.Options{Clock: clock})
	o := redisledger.Options{Addr: addr, ReplicaID: id, KeyPrefix: "test:" + t.Name() + ":", Clock: clock,
		Liveness: 400 * time.Millisecond, ReadTimeout: 100 * time.Millisecond}
	if mut != nil {
		mut(&o)
	}
	sh, err := redisledger.New(o, dec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sh.Close() })
	return &replica{clock: clock, dec: dec, sh: sh}
}

// eventually polls cond (a real condition in Redis or a background loop) for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBadOptions(t *testing.T) {
	for _, addr := range []string{"", "no-port"} {
		if _, err := redisledger.New(redisledger.Options{Addr: addr}, ledger.NewDecode(ledger.Options{})); err == nil {
			t.Errorf("address %q accepted", addr)
		}
	}
}

// Two replicas through a real redis-server: one's charges reach the other's scores with
// their output growth; releases, dead replicas and a Redis outage (kill and restart) each
// do what they should, and an outage never blocks or fails a read for long.
func TestTwoReplicas(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a := newReplica(t, srv.Addr(), "A", nil)
	b := newReplica(t, srv.Addr(), "B", nil)
	d := ledger.Pod{Namespace: "ns", Name: "decode-0"}
	b.sh.Watch(d)
	a.sh.Watch(d)

	// A routes two requests to d at its t0 and publishes 10 s later: Σ elapsed = 20 s.
	c1 := a.dec.Acquire(d, 5000, 0)
	c2 := a.dec.Acquire(d, 1000, 0)
	a.clock.Advance(10 * time.Second)
	start := time.Now()
	if err := a.sh.Publish(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := b.sh.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	r := b.sh.Remote(d)
	slack := 2 * time.Since(start).Seconds() // both requests age while the test runs
	if r.Tokens != 6000 || r.Count != 2 || r.Elapsed < 20-1e-3 || r.Elapsed > 20+slack+0.01 {
		t.Fatalf("B sees %+v, want 6000 tokens, 2 requests, 20 s elapsed (+%.3f)", r, slack)
	}
	// B scores A's charges: 6000 + rate 2 × 20 s (B's own ledger is empty).
	if got := b.dec.Load(d, 2, true); math.Abs(got-(6000+2*r.Elapsed)) > 0.1 {
		t.Fatalf("B's score %v, want about %v", got, 6000+2*r.Elapsed)
	}
	// A does not count its own field twice.
	if err := a.sh.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.dec.Load(d, 0, false); got != 6000 {
		t.Fatalf("A's score %v, want its local 6000 only", got)
	}

	// A release is published as the new absolute value.
	c1.Release()
	if err := a.sh.Publish(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := b.sh.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if r := b.sh.Remote(d); r.Tokens != 1000 || r.Count != 1 {
		t.Fatalf("after release B sees %+v, want 1000 tokens, 1 request", r)
	}

	// Outage: kill Redis. Reads fail fast and B scores from its local ledger.
	srv.Kill()
	begin := time.Now()
	if err := b.sh.Refresh(ctx); err == nil {
		t.Fatal("refresh succeeded with Redis down")
	}
	if took := time.Since(begin); took > time.Second {
		t.Fatalf("a failed read took %v", took)
	}
	if r := b.sh.Remote(d); r != (ledger.RemoteLoad{}) {
		t.Fatalf("Redis down: B still adds %+v", r)
	}
	bc := b.dec.Acquire(d, 300, 0)
	if got := b.dec.Load(d, 0, false); got != 300 {
		t.Fatalf("Redis down: B's score %v, want its local 300", got)
	}
	if err := a.sh.Publish(ctx, false); err == nil {
		t.Fatal("publish succeeded with Redis down")
	}

	// Redis comes back empty; the periodic full republish restores both ledgers.
	srv.Start()
	if err := a.sh.Publish(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := b.sh.Publish(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := b.sh.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.dec.Load(d, 0, false); got != 1300 {
		t.Fatalf("after restart B's score %v, want 300 local + 1000 from A", got)
	}
	if err := a.sh.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.dec.Load(d, 0, false); got != 1300 {
		t.Fatalf("after restart A's score %v, want 1000 local + 300 from B", got)
	}

	// A stops heartbeating (it never publishes again): after the liveness window B drops
	// its charges and prunes its field.
	eventually(t, "B drops the dead replica A", func() bool {
		_ = b.sh.Refresh(ctx)
		return b.sh.Remote(d).Tokens == 0
	})
	if err := b.sh.Publish(ctx, false); err != nil {
		t.Fatal(err)
	}
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, DisableIdentity: true})
	defer raw.Close()
	fields, err := raw.HGetAll(ctx, "test:"+t.Name()+":ns/decode-0").Result()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fields["A"]; ok || fields["B"] == "" {
		t.Fatalf("fields after pruning: %v, want only B", fields)
	}
	if ttl, _ := raw.PTTL(ctx, "test:"+t.Name()+":ns/decode-0").Result(); ttl <= 0 || ttl > redisledger.DefaultKeyTTL {
		t.Fatalf("pod key TTL %v, want (0, %v]", ttl, redisledger.DefaultKeyTTL)
	}
	// B's last release deletes its field: a zero ledger is written as HDEL.
	bc.Release()
	c2.Release()
	if err := b.sh.Publish(ctx, false); err != nil {
		t.Fatal(err)
	}
	if n, _ := raw.HLen(ctx, "test:"+t.Name()+":ns/decode-0").Result(); n != 0 {
		t.Fatalf("%d fields left after every release", n)
	}
}

// With Run, replicas find each other, lose each other in an outage and find each other
// again after a restart without any call from outside.
func TestRunRecoversByItself(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fast := func(o *redisledger.Options) {
		o.RefreshInterval = 20 * time.Millisecond
		o.PublishInterval = 50 * time.Millisecond
	}
	a := newReplica(t, srv.Addr(), "A", fast)
	b := newReplica(t, srv.Addr(), "B", fast)
	d := ledger.Pod{Namespace: "ns", Name: "decode-0"}
	b.sh.Watch(d)
	done := make(chan struct{}, 2)
	for _, r := range []*replica{a, b} {
		go func() { r.sh.Run(ctx); done <- struct{}{} }()
	}
	a.dec.Acquire(d, 4000, 0)
	eventually(t, "B sees A's 4000 tokens", func() bool { return b.dec.Load(d, 0, false) == 4000 })
	srv.Kill()
	eventually(t, "B falls back to its local ledger", func() bool { return b.dec.Load(d, 0, false) == 0 })
	srv.Start()
	eventually(t, "B sees A's 4000 tokens after the restart", func() bool { return b.dec.Load(d, 0, false) == 4000 })
	cancel()
	<-done
	<-done
}

// Password and TLS options reach Redis: a wrong password and an unverified self-signed
// certificate are refused, the right settings work.
func TestPasswordAndTLS(t *testing.T) {
	ctx := context.Background()
	d := ledger.Pod{Namespace: "ns", Name: "decode-0"}
	roundTrip := func(addr string, mut func(*redisledger.Options)) error {
		r := newReplica(t, addr, "A", mut)
		r.dec.Acquire(d, 10, 0)
		if err := r.sh.Publish(ctx, true); err != nil {
			return err
		}
		return r.sh.Refresh(ctx)
	}
	pw := redistest.StartWith(t, redistest.Options{Password: "s3cret"})
	if err := roundTrip(pw.Addr(), nil); err == nil {
		t.Fatal("no password: accepted")
	}
	if err := roundTrip(pw.Addr(), func(o *redisledger.Options) { o.Password = "wrong" }); err == nil {
		t.Fatal("wrong password: accepted")
	}
	if err := roundTrip(pw.Addr(), func(o *redisledger.Options) { o.Password = "s3cret" }); err != nil {
		t.Fatalf("right password: %v", err)
	}
	tl := redistest.StartWith(t, redistest.Options{TLS: true})
	slow := func(o *redisledger.Options) { o.ReadTimeout = time.Second } // TLS handshakes under -race
	if err := roundTrip(tl.Addr(), func(o *redisledger.Options) { slow(o) }); err == nil {
		t.Fatal("plain TCP to a TLS port: accepted")
	}
	if err := roundTrip(tl.Addr(), func(o *redisledger.Options) { slow(o); o.TLS = true }); err == nil {
		t.Fatal("self-signed certificate verified without a trusted CA")
	}
	if err := roundTrip(tl.Addr(), func(o *redisledger.Options) { slow(o); o.TLS, o.TLSSkipVerify = true, true }); err != nil {
		t.Fatalf("TLS with skip-verify: %v", err)
	}
}

// The latency models' booked prefill work (pd-predictive) travels the same way under Run:
// a charge on A reaches B's predicted wait without any call from outside, and its end
// removes it.
func TestRunSharesPredictedPrefill(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clock := load.NewManualClock(t0)
	models := func(id string) (*latency.Models, *redisledger.Shared) {
		m := latency.New(latency.Options{Clock: clock})
		sh, err := redisledger.New(redisledger.Options{Addr: srv.Addr(), ReplicaID: id, KeyPrefix: "test:" + t.Name() + ":", Clock: clock,
			Latency: m, RefreshInterval: 20 * time.Millisecond, PublishInterval: 50 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sh.Close() })
		return m, sh
	}
	mA, sA := models("A")
	mB, sB := models("B")
	const key = "ns/prefill-0:8000"
	sB.WatchPrefill(key)
	done := make(chan struct{}, 2)
	for _, s := range []*redisledger.Shared{sA, sB} {
		go func() { s.Run(ctx); done <- struct{}{} }()
	}
	wait := func(m *latency.Models) float64 { f := m.Forecast(key); return f.Wait() }
	mA.Charge(1, latency.Charge{Kind: outcome.KindPD, Prefill: key, Destination: "ns/decode-0:8000",
		Prompt: latency.Prompt{Tokens: 8000}, Service: 30})
	eventually(t, "B predicts A's 30 s of booked prefill", func() bool { w := wait(mB); return w > 25 && w <= 30 })
	mA.Observe(&outcome.Event{Phase: outcome.PhaseEnd, Route: outcome.Route{ID: 1, Kind: outcome.KindPD, Prefill: key,
		Destination: "ns/decode-0:8000", PromptTokens: 8000, Picked: t0, End: t0}})
	eventually(t, "B's predicted wait drops once A's route ended", func() bool { return wait(mB) == 0 })
	cancel()
	<-done
	<-done
}
