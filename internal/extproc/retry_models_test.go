package extproc

import (
	"errors"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/testnet"
)

// lifecycleRoutes keeps the events of the outcome records (Deps.Outcomes).
type lifecycleRoutes struct {
	mu  sync.Mutex
	evs []outcome.Event
}

func (c *lifecycleRoutes) Observe(e *outcome.Event) {
	c.mu.Lock()
	c.evs = append(c.evs, *e)
	c.mu.Unlock()
}

func (c *lifecycleRoutes) events() []outcome.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]outcome.Event(nil), c.evs...)
}

// A pair-level retry under pd-predictive and under the token-load policies: once the
// retried request completed, the latency models' busy-until ledgers, the PD trackers and the
// token-load ledgers hold nothing; the first attempt's booking was given back when its leg
// failed (before the second pick), the models saw that leg as a failure, not as a slow
// prefill, and the first attempt ended as retried.
func TestPrefillRetryReleasesModelsAndLedgers(t *testing.T) {
	for _, strategy := range []string{pd.StrategyPredictive, pd.StrategyName} {
		t.Run(strategy, func(t *testing.T) {
			var models *latency.Models
			var tokens *pd.TokenLoad
			var seen lifecycleRoutes
			rg := newRetryRigWith(t, config.DefaultRetry(), http.StatusOK, testnet.RefusedAddr(t), func(rg *retryRig, gw *config.Gateway, _ *Options) {
				gw.DefaultStrategy = strategy
				models = latency.New(latency.Options{})
				rg.deps.Outcomes.Subscribe(models)
				rg.deps.Outcomes.Subscribe(&seen)
				tokens = pd.NewTokenLoad(gw.PD, ledger.Options{})
				rg.cascade = pd.New(pd.Options{Deps: rg.deps, Gateway: gw.PD, Models: models, TokenLoad: tokens})
				if strategy == pd.StrategyName {
					gw.PD.PrefillScorePolicy, gw.PD.DecodeScorePolicy = pd.PolicyTokenLoad, pd.PolicyTokenLoad
				}
			})
			req := retryReq
			if strategy == pd.StrategyName {
				// Steer the first pick to rs-a: prefill-b and decode-b carry the test's own
				// token charges (released below).
				pc := tokens.Prefill.Acquire(ledger.PodOf(rg.eps["prefill-b"]), 1e6, time.Hour)
				dc := tokens.Decode.Acquire(ledger.PodOf(rg.eps["decode-b"]), 1e6, time.Hour)
				defer func() {
					pc.ReleaseAll()
					dc.Release()
					checkTokensIdle(t, rg, tokens)
				}()
			}
			if strategy == pd.StrategyPredictive {
				// A TPOT objective no decode pod running a prompt itself meets: the request is
				// disaggregated.
				req.Headers = envoy.Headers("x-request-id", "r-1", "x-slo-tpot-ms", "11")
				// Steer the first pick to prefill-a: prefill-b has 10 s of work booked (the
				// test's own route, ended below).
				tr := rg.deps.Outcomes.Start(outcome.KindPD, rg.eps["prefill-b"].Key(), rg.eps["decode-b"].Key(), 10)
				models.Charge(tr.ID(), latency.Charge{Kind: outcome.KindPD, Prefill: rg.eps["prefill-b"].Key(),
					Destination: rg.eps["decode-b"].Key(), Prompt: latency.Prompt{Tokens: 10}, Service: 10})
				defer func() {
					tr.PrefillEnd(errors.New("the test's booking"), true)
					tr.End(errors.New("the test's booking"))
					checkModelsIdle(t, rg, models)
				}()
			}
			s, routed, err := rg.client.Route(testCtx(t), req)
			if err != nil {
				t.Fatal(err)
			}
			if routed.Immediate != nil {
				t.Fatalf("answered %d %s, want the retried route", routed.Immediate.Status, routed.Immediate.Body)
			}
			if got := rg.obs.got(); got != RetryRecovered {
				t.Fatalf("retry results %q, want recovered (destination %s)", got, routed.Destination)
			}
			if _, err := s.Respond(envoy.Response{Status: 200, Chunks: [][]byte{[]byte(`{"choices":[]}`), []byte(`{}`)}}); err != nil {
				t.Fatal(err)
			}
			_ = s.CloseSend()
			rg.held(t)
			if strategy == pd.StrategyName {
				checkModelsIdle(t, rg, models) // pd-predictive checks once its own booking ended
			}
			// The first route (prefill-a's) ended its leg with an error, then as retried.
			evs := seen.events()
			var first uint64
			for _, e := range evs {
				if e.Phase == outcome.PhaseStart && e.Route.Prefill == rg.eps["prefill-a"].Key() {
					first = e.Route.ID
					break
				}
			}
			if first == 0 {
				t.Fatalf("no route on prefill-a: %+v", evs)
			}
			var leg, end *outcome.Route
			for i := range evs {
				if evs[i].Route.ID == first && evs[i].Phase == outcome.PhasePrefillEnd {
					leg = &evs[i].Route
				}
				if evs[i].Route.ID == first && evs[i].Phase == outcome.PhaseEnd {
					end = &evs[i].Route
				}
			}
			if leg == nil || leg.PrefillErr == nil || !leg.PrefillObserved {
				t.Errorf("prefill-a's leg was not reported to the models as a failed leg: %+v", leg)
			}
			if end == nil || !errors.Is(end.Err, ErrAttemptRetried) {
				t.Errorf("the first attempt did not end as retried: %+v", end)
			}
			if backlog, charges := models.Local(rg.eps["prefill-a"].Key(), models.Now()); backlog != 0 || charges != 0 {
				t.Errorf("prefill-a still booked: %v s, %d charges", backlog, charges)
			}
			if c := models.Coefficients(rg.eps["prefill-a"].Key()); c.PrefillObservations != 0 {
				t.Errorf("prefill-a's failed leg fitted its prefill model: %+v", c)
			}
		})
	}
}

// checkModelsIdle: no pod's model still counts a booking or a request.
func checkModelsIdle(t *testing.T, rg *retryRig, m *latency.Models) {
	t.Helper()
	idle := m.Forecast("ns/never-routed:1")
	for _, e := range rg.eps {
		if backlog, charges := m.Local(e.Key(), m.Now()); backlog != 0 || charges != 0 {
			t.Errorf("%s still booked on the models: %v s, %d charges", e.Key(), backlog, charges)
		}
		f := m.Forecast(e.Key())
		if f.Step(0) != idle.Step(0) {
			t.Errorf("%s: the models still count requests there (step %v, idle %v)", e.Key(), f.Step(0), idle.Step(0))
		}
	}
}

// checkTokensIdle: the token-load ledgers hold no charge.
func checkTokensIdle(t *testing.T, rg *retryRig, tokens *pd.TokenLoad) {
	t.Helper()
	for _, e := range rg.eps {
		p := ledger.PodOf(e)
		if a, kv := tokens.Prefill.Load(p); a != 0 || kv != 0 {
			t.Errorf("%s: prefill token ledger active %v kv %v", e.Key(), a, kv)
		}
		if n, open, _ := tokens.Decode.Local(p); n != 0 || open != 0 {
			t.Errorf("%s: decode token ledger %v tokens, %d open", e.Key(), n, open)
		}
	}
	if tokens.Prefill.Open() != 0 || tokens.Decode.Open() != 0 {
		t.Errorf("open token charges: prefill %d, decode %d", tokens.Prefill.Open(), tokens.Decode.Open())
	}
}

// A PD pair routed whole to its decode pod for a destination-only client runs no prefill leg:
// the latency models give the prefill pod's booking back and do not time a prefill that
// never ran (as one that took no time, which taught the pod's model that prefills are free).
func TestRoutedWholeIsNoPrefillForTheModels(t *testing.T) {
	var models *latency.Models
	var seen lifecycleRoutes
	rg := newRetryRigWith(t, config.DefaultRetry(), http.StatusOK, "127.0.0.1:1", func(rg *retryRig, gw *config.Gateway, o *Options) {
		gw.DefaultStrategy = pd.StrategyPredictive
		o.Client = config.ClientDestinationOnly
		models = latency.New(latency.Options{})
		rg.deps.Outcomes.Subscribe(models)
		rg.deps.Outcomes.Subscribe(&seen)
		rg.cascade = pd.New(pd.Options{Deps: rg.deps, Gateway: gw.PD, Models: models})
	})
	req := retryReq
	req.Headers = envoy.Headers("x-request-id", "r-1", "x-slo-tpot-ms", "11") // disaggregated
	for range 3 {
		s, routed, err := rg.client.Route(testCtx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		if routed.Immediate != nil || strings.Contains(routed.Destination, ",") {
			t.Fatalf("routed %+v, want a whole route", routed)
		}
		_ = s.CloseSend()
		_, _ = s.Recv()
		time.Sleep(10 * time.Millisecond) // beyond one iteration: the next end closes the group
	}
	pairs := 0
	for _, e := range seen.events() {
		if e.Phase == outcome.PhaseStart && e.Route.Kind == outcome.KindPD {
			pairs++
		}
	}
	if pairs == 0 {
		t.Fatal("pd-predictive chose no pair: the test does not exercise routing a pair whole")
	}
	for _, name := range []string{"prefill-a", "prefill-b"} {
		k := rg.eps[name].Key()
		if c := models.Coefficients(k); c.PrefillObservations != 0 {
			t.Errorf("%s: %d prefill observations from legs that never ran", name, c.PrefillObservations)
		}
		if backlog, charges := models.Local(k, models.Now()); backlog != 0 || charges != 0 {
			t.Errorf("%s still booked: %v s, %d charges", name, backlog, charges)
		}
	}
}

// TestOneOutcomeRecordPerRequest: a routed request has one outcome record, the decision's,
// which every reader reads: the strategy's lifecycle starts it and writes its events, the
// server reports into it what only it knows (here, the endpoint that served), and each event is
// written once — one start, one prefill end (inferred: a sidecar ran the leg), one first byte,
// each later chunk once, one end.
func TestOneOutcomeRecordPerRequest(t *testing.T) {
	var seen lifecycleRoutes
	rg := newRetryRigWith(t, config.Retry{}, http.StatusOK, testnet.RefusedAddr(t), func(rg *retryRig, gw *config.Gateway, _ *Options) {
		gw.PD.Handoff = config.HandoffSidecar
		rg.deps.Outcomes.Subscribe(&seen)
	})
	s, routed, err := rg.client.Route(testCtx(t), retryReq)
	if err != nil || routed.Immediate != nil {
		t.Fatalf("route: %v %+v", err, routed)
	}
	decode := rg.eps["decode-a"]
	if _, err := s.Respond(envoy.Response{Status: 200, Served: decode.HostPort(),
		Chunks: [][]byte{[]byte("data: a\n\n"), []byte("data: b\n\n"), []byte("data: [DONE]\n\n")}}); err != nil {
		t.Fatal(err)
	}
	count := map[outcome.Phase]int{}
	ids := map[uint64]bool{}
	var end outcome.Route
	for _, e := range seen.events() {
		if e.Phase == outcome.PhaseProbe {
			continue
		}
		count[e.Phase]++
		ids[e.Route.ID] = true
		if e.Phase == outcome.PhaseEnd {
			end = e.Route
		}
	}
	want := map[outcome.Phase]int{outcome.PhaseStart: 1, outcome.PhasePrefillEnd: 1, outcome.PhaseFirstByte: 1,
		outcome.PhaseProgress: 2, outcome.PhaseEnd: 1}
	if len(ids) != 1 || !maps.Equal(count, want) {
		t.Fatalf("%d routes, events %v; want one route with %v", len(ids), count, want)
	}
	if end.Kind != outcome.KindPD || end.Served != decode.Key() || end.Chunks != 3 || end.Status != 200 || end.Err != nil {
		t.Errorf("the record at its end: %+v", end)
	}
}
