package pd_test

import (
	"context"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger/redistest"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
)

// Two Tandem pickers as two replicas sharing the decode ledger through a real redis-server:
// B steers away from the decode pod A loaded, falls back to its own ledger while Redis is
// down (never failing a pick) and shares again once Redis is back.
func TestSharedDecodeLedgerTwoPickers(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	mut := func(g *config.PD) {
		g.PrefillScorePolicy = pd.PolicyLeastRequest
		g.DecodeScorePolicy = pd.PolicyTokenLoad
	}
	pods := []string{"p0:prefill:A", "d0:decode:A", "d1:decode:A"}
	hA, hB := newTL(t, mut, pods...), newTL(t, mut, pods...)
	share := func(h *tlHarness, id string) *redisledger.Shared {
		s, err := redisledger.New(redisledger.Options{Addr: srv.Addr(), ReplicaID: id, KeyPrefix: "test:" + t.Name() + ":",
			Clock: h.clock}, h.tl.Decode)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		s.Watch(h.pod("d0"), h.pod("d1"))
		return s
	}
	sA, sB := share(hA, "A"), share(hB, "B")
	sync := func() {
		t.Helper()
		if err := sA.Publish(ctx, true); err != nil {
			t.Fatal(err)
		}
		if err := sB.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Replica A routes a 20000-token prompt to decode pod X.
	long := hA.pick(tlReq(t, "long ", 20000, nil))
	x := long.Destination[0].Name
	other := map[string]string{"d0": "d1", "d1": "d0"}[x]
	sync()
	// Replica B's ledger is empty, but it adds A's 20000 tokens on X: ten 100-token requests
	// (1000 tokens in all) go to the other pod.
	var held []*picker.Decision
	for i := range 10 {
		d := hB.pick(tlReq(t, "short ", 100, nil))
		if got := d.Destination[0].Name; got != other {
			t.Fatalf("B's pick %d went to %s, which A loaded with 20000 tokens", i, got)
		}
		held = append(held, d)
	}
	for _, d := range held {
		d.Lifecycle.Done(nil)
	}

	// Redis dies: B's read fails, its view is dropped and it scores from its own ledger —
	// two requests held open land on different pods — without failing a pick.
	srv.Kill()
	if err := sB.Refresh(ctx); err == nil {
		t.Fatal("refresh succeeded with Redis down")
	}
	d1, d2 := hB.pick(tlReq(t, "short ", 100, nil)), hB.pick(tlReq(t, "short ", 100, nil))
	if d1.Destination[0].Name == d2.Destination[0].Name {
		t.Fatalf("Redis down: both picks went to %s; B should score its local ledger only", d1.Destination[0].Name)
	}
	d1.Lifecycle.Done(nil)
	d2.Lifecycle.Done(nil)

	// Redis is back (empty): A's periodic republish restores the picture.
	srv.Start()
	sync()
	if r := sB.Remote(ledger.PodOf(long.Destination[0])); r.Tokens != 20000 {
		t.Fatalf("after restart B sees %+v on %s, want 20000 tokens", r, x)
	}
	if got := hB.pick(tlReq(t, "short ", 100, nil)).Destination[0].Name; got != other {
		t.Fatalf("after restart B picked %s, want %s", got, other)
	}
}
