package picker

import (
	"context"
	"sync"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// routeLog keeps the last event of every route the recorder publishes.
type routeLog struct {
	mu   sync.Mutex
	last map[uint64]outcome.Route
}

func (r *routeLog) Observe(e *outcome.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[uint64]outcome.Route{}
	}
	r.last[e.Route.ID] = e.Route
}

// When the gateway reports that a fallback served a single-endpoint decision, the chain's
// lifecycle counts the request as running there and its outcome record names it, so the
// latency models time the pod that answered, not the primary that refused.
func TestTrackedFollowsTheServedFallback(t *testing.T) {
	deps := NewDeps(nil, config.DefaultPD().PrefixCache)
	var got routeLog
	deps.Outcomes.Subscribe(&got)
	a, b, c := ep("a", "", ""), ep("b", "", ""), ep("c", "", "")
	snap := snapOf(a, b, c)
	d, err := NewLeastRequestStrategy(deps).Pick(context.Background(),
		&Cycle{Req: parse(t, nil, "hi"), Snap: snap, Candidates: snap.Endpoints, State: &CycleState{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Destination) < 2 {
		t.Fatalf("destination %v: want fallbacks", d.Destination)
	}
	primary, fallback := d.Destination[0], d.Destination[1]
	d.Lifecycle.ResponseHeaders(200, fallback)
	if n := deps.Running.InFlight(primary.Key()); n != 0 {
		t.Errorf("primary %s still counted running (%d) while %s serves", primary.Key(), n, fallback.Key())
	}
	if n := deps.Running.InFlight(fallback.Key()); n != 1 {
		t.Errorf("fallback %s counted %d running, want 1", fallback.Key(), n)
	}
	d.Lifecycle.ResponseBody(5, true)
	d.Lifecycle.Done(nil)
	for _, e := range []*pool.Endpoint{a, b, c} {
		if n := deps.Running.InFlight(e.Key()); n != 0 {
			t.Errorf("%s still counted running: %d", e.Key(), n)
		}
	}
	if len(got.last) != 1 {
		t.Fatalf("%d routeLog recorded, want 1", len(got.last))
	}
	for _, r := range got.last {
		if r.ServedBy() != fallback.Key() {
			t.Errorf("the outcome names %q as serving, want the fallback %q", r.ServedBy(), fallback.Key())
		}
	}
	if n := deps.Drain.PerSecond(fallback.Key()); n <= 0 {
		t.Errorf("the fallback's drain rate did not see the completion")
	}
}
