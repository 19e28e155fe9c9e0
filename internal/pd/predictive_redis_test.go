package pd_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger/redistest"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// Two pd-predictive replicas sharing their predicted prefill work through a real
// redis-server: a long prompt A booked on a prefill pod is in B's predicted wait there, so
// B sends its own long prompt to the other prefill pod; while Redis is down B predicts from
// its own ledger again (and never fails a pick), and the work A's prompt drained is deleted.
func TestSharedPredictedPrefillTwoReplicas(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	clock := load.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	// Two rolesets of 1 prefill + 1 decode pod, no standard pods.
	var eps []*pool.Endpoint
	for r, rs := range []string{"rs0", "rs1"} {
		for i, role := range []string{"prefill", "decode"} {
			eps = append(eps, pool.NewEndpoint("ns", role+"-"+rs, "10.6."+string(rune('0'+r))+"."+string(rune('1'+i)), 8000, 0,
				map[string]string{pool.LabelRoleName: role, pool.LabelRolesetName: rs, pool.LabelModelName: "m"}, nil))
		}
	}
	snap := pool.NewStore().Publish(pool.Info{}, eps, true)
	replica := func(id string) (*app.Picker, *redisledger.Shared) {
		gw := config.DefaultGateway()
		gw.DefaultStrategy = pd.StrategyPredictive
		p, err := app.BuildPicker(app.PickerOptions{Clock: clock, Gateway: gw, Logger: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		s, err := redisledger.New(redisledger.Options{Addr: srv.Addr(), ReplicaID: id, KeyPrefix: "test:" + t.Name() + ":",
			Clock: clock, Latency: p.Models, Liveness: 400 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		for _, e := range eps {
			s.WatchPrefill(e.Key())
		}
		return p, s
	}
	pA, sA := replica("A")
	pB, sB := replica("B")
	long := func(p *app.Picker) *picker.Decision {
		t.Helper()
		// 20k tokens: seconds of prefill on the cold-start model, far beyond what a decode pod
		// may run itself, so the pair is the only placement.
		d, err := p.Router.Schedule(ctx, completion(t, strings.Repeat("long ", 16000), map[string]string{wire.HeaderSLOTTFT: "5000"}), snap, snap.Endpoints)
		if err != nil {
			t.Fatal(err)
		}
		if d.Outcome != picker.OutcomePD || len(d.Prefill) == 0 {
			t.Fatalf("a long prompt was not disaggregated: %s %s", d.Outcome, d.Step)
		}
		return d
	}

	dA := long(pA)
	x := dA.Prefill[0].Key()
	aheadA, _ := pA.Models.Local(x, clock.Now())
	if aheadA < 0.2 {
		t.Fatalf("A booked %.3f s on %s, want a long prefill", aheadA, x)
	}
	if w := forecastWait(pB, x); w != 0 {
		t.Fatalf("before sharing B predicts a %.3f s wait on %s, want 0", w, x)
	}
	if err := sA.Publish(ctx, true); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := sB.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	// B's wait on X is A's booking, less the real time the round trips took (Redis's clock).
	slack := 2*time.Since(start).Seconds() + 0.05
	if w := forecastWait(pB, x); math.Abs(w-aheadA) > slack {
		t.Fatalf("B predicts a %.3f s wait on %s, want A's %.3f s (±%.3f)", w, x, aheadA, slack)
	}
	if w := forecastWait(pA, x); math.Abs(w-aheadA) > 1e-6 {
		t.Fatalf("A predicts %.3f s on %s, want its own %.3f s only (its field is not added twice)", w, x, aheadA)
	}
	dB := long(pB)
	if got := dB.Prefill[0].Key(); got == x {
		t.Fatalf("B sent its long prompt to %s, where A booked %.3f s", got, aheadA)
	}

	// Redis down: B's reads fail and, once the view is dropped, B predicts from its own
	// ledger: X is free again from B's point of view, and picks keep working.
	srv.Kill()
	if err := sB.Refresh(ctx); err == nil {
		t.Fatal("refresh succeeded with Redis down")
	}
	if w := forecastWait(pB, x); w != 0 {
		t.Fatalf("Redis down: B still adds %.3f s on %s", w, x)
	}
	dB.Lifecycle.Done(nil)
	long(pB).Lifecycle.Done(nil)

	// Redis back, A's prefill ended (its actual end corrects the ledger): A's field is
	// deleted and B sees no work on X.
	srv.Start()
	if po, ok := dA.Lifecycle.(pd.PrefillObserver); ok {
		po.PrefillDone(nil)
	}
	dA.Lifecycle.Done(nil)
	if ahead, _ := pA.Models.Local(x, clock.Now()); ahead != 0 {
		t.Fatalf("A's ledger still holds %.3f s on %s after the prefill ended", ahead, x)
	}
	if err := sA.Publish(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := sB.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if w := forecastWait(pB, x); w != 0 {
		t.Fatalf("after A's prefill ended B predicts %.3f s on %s, want 0", w, x)
	}
}

func forecastWait(p *app.Picker, key string) float64 {
	f := p.Models.Forecast(key)
	return f.Wait()
}
