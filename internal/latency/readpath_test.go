package latency

import (
	"math"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// A forecast read off an endpoint is the key's models: it sees charges made by key, and a
// Forget of the key starts it from the defaults again.
func TestForecastOfEndpointFollowsTheKeysModels(t *testing.T) {
	clock := load.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m, other := New(Options{Clock: clock}), New(Options{Clock: clock})
	e := pool.NewEndpoint("ns", "p", "10.0.0.1", 8000, 0, nil, nil)
	if f := m.ForecastOf(e); f.Wait() != 0 {
		t.Fatalf("fresh pod: wait %.3f", f.Wait())
	}
	m.Charge(1, Charge{Kind: outcome.KindWhole, Prefill: e.Key(), Destination: e.Key(), Prompt: Prompt{Tokens: 1000}, Service: 0.4})
	f := m.ForecastOf(e)
	if f.Wait() < 0.39 {
		t.Fatalf("after a 0.4 s charge: wait %.3f", f.Wait())
	}
	var out [1]Forecast
	m.ForecastEndpoints(1, func(int) *pool.Endpoint { return e }, out[:])
	if byKey := m.Forecast(e.Key()); out[0] != byKey || f != byKey {
		t.Fatalf("off the endpoint %+v / %+v, by key %+v", out[0], f, byKey)
	}
	if g := other.ForecastOf(e); g.Wait() != 0 { // another Models sharing the endpoint keeps its own
		t.Fatalf("the other models read wait %.3f", g.Wait())
	}
	m.Forget(func(string) bool { return false })
	if f := m.ForecastOf(e); f.Wait() != 0 {
		t.Fatalf("forgotten: wait %.3f, want the defaults' 0", f.Wait())
	}
	if len(m.Keys()) != 1 {
		t.Fatalf("the forecast after Forget made %d models, want 1", len(m.Keys()))
	}
}

// The stall budgets of ended requests that wait below a long-lived tight budget are dropped
// as new ones come: a pod's budgets stay a few times its decoding requests, whatever the
// throughput, and the room is still the live requests' tightest.
func TestStallBudgetsOfEndedRequestsAreDropped(t *testing.T) {
	r := newRig(Options{})
	d := "ns/d:1"
	tight := r.rec.Start(outcome.KindPD, "ns/p:1", d, 100)
	r.m.Charge(tight.ID(), Charge{Kind: outcome.KindPD, Prefill: "ns/p:1", Destination: d, Prompt: Prompt{Tokens: 100},
		Service: 0.01, TPOT: 0.010, TPOTObjective: 0.050, MaxTokens: 6}) // room 0.2 s, for as long as it runs
	for range 5000 {
		tr := r.rec.Start(outcome.KindPD, "ns/p:1", d, 100)
		r.m.Charge(tr.ID(), Charge{Kind: outcome.KindPD, Prefill: "ns/p:1", Destination: d, Prompt: Prompt{Tokens: 100},
			Service: 0.01, TPOT: 0.010, TPOTObjective: 0.050, MaxTokens: 500})
		tr.End(nil)
	}
	r.m.mu.Lock()
	n := len(r.m.pods[d].slack.budgets)
	r.m.mu.Unlock()
	if n > 64 {
		t.Fatalf("%d stall budgets kept for 1 decoding request after 5000 ended", n)
	}
	if room := r.m.StallRoom(d); !near(room, 0.2, 1e-9) {
		t.Fatalf("room %.4f, want the tight request's 0.2", room)
	}
	tight.End(nil)
	if room := r.m.StallRoom(d); !math.IsInf(room, 1) {
		t.Fatalf("every request ended: room %v, want +Inf", room)
	}
}
