package picker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Every strategy picks behind the same health filter: an ejected endpoint is never a candidate
// (not even a fallback), and one whose last outcome is a recent failure is left out while the
// request can be served without it, however idle it looks.
func TestRouterHealthFilter(t *testing.T) {
	a, b, c := ep("a", "", ""), ep("b", "", ""), ep("c", "", "")
	store := pool.NewStore()
	snap := store.Publish(pool.Info{}, []*pool.Endpoint{a, b, c}, true)
	cfg := config.DefaultOutlier()
	cfg.MaxEjectionPercent = 100
	det := health.New(health.Options{Config: cfg, Store: store})
	rec := outcome.NewRecorder(nil)
	rec.Subscribe(det)
	deps := NewDeps(nil, config.PrefixCache{})
	r, err := NewRouter(RouterOptions{Resolver: newResolver(t, ""), Health: det,
		Strategies: []Strategy{NewRandom(deps), NewLeastRequestStrategy(deps), NewPrefixCache(deps, config.DefaultPD())}})
	if err != nil {
		t.Fatal(err)
	}
	rec.Probe(outcome.Probe{Endpoint: a.Key(), Source: "scrape"}) // a served, then its port refused
	rec.Probe(outcome.Probe{Endpoint: a.Key(), Err: errors.New("refused"), Refused: true, ServingPort: true})
	tr := rec.Start(outcome.KindWhole, "", b.Key(), 1)
	tr.Response(500, "") // b failed in a millisecond: it holds nothing and would look the least loaded
	tr.End(nil)
	if !det.Ejected(a.Key()) || !det.RecentFailure(b.Key()) {
		t.Fatalf("setup: a %+v, b %+v", det.Status(a.Key()), det.Status(b.Key()))
	}
	for range 5 {
		deps.Running.Start(c.Key()) // c is busy: without the filter least-request picks a or b
	}
	for _, s := range []string{"random", "least-request", "prefix-cache"} {
		for range 20 {
			d, err := r.Schedule(context.Background(), parse(t, map[string]string{"routing-strategy": s}, "hello"), snap, snap.Endpoints)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range d.Destination {
				if e == a || e == b {
					t.Fatalf("%s routed to %s (destinations %v)", s, e.Name, hostPorts(d.Destination))
				}
			}
			if d.Trace.Health[a.Key()] != "ejected:connection_refused" || d.Trace.Health[b.Key()] != "recent_failure" ||
				!strings.Contains(strings.Join(d.Trace.Steps, ","), StepHealthFilter) {
				t.Fatalf("%s: trace %+v", s, d.Trace)
			}
			d.Lifecycle.Done(nil)
		}
	}

	// Without c, the request cannot be served without b: b is readmitted, a stays out.
	sub := []*pool.Endpoint{a, b}
	d, err := r.Schedule(context.Background(), parse(t, map[string]string{"routing-strategy": "least-request"}, "x"), snap, sub)
	if err != nil || len(d.Destination) != 1 || d.Destination[0] != b || !strings.Contains(strings.Join(d.Trace.Steps, ","), StepHealthReadmits) {
		t.Fatalf("readmitting b: %+v %v", d, err)
	}
	d.Lifecycle.Done(nil)

	// Only ejected endpoints reachable: a clear 503.
	_, err = r.Schedule(context.Background(), parse(t, nil, "x"), snap, []*pool.Endpoint{a})
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Status != 503 || ae.Reason != "all_ejected" || !strings.Contains(ae.Message, a.Key()+" ejected:connection_refused") {
		t.Fatalf("only ejected candidates: %v", err)
	}
}
