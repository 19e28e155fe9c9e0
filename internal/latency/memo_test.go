package latency

import (
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
