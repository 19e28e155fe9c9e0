package pd

import (
	"errors"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// pd-predictive's whole-request decisions (a prompt run on a decode pod, or on a standard
// pod) take their fallbacks from pods of the same kind among the candidates passive health
// admits: never a prefill-only pod, never an ejected pod; a pair's fallbacks likewise.
func TestPredictiveFallbacksArePDSafeAndHealthy(t *testing.T) {
	gw := gateway(nil)
	h := newHarness(t, gw, P("pa", "a"), D("da1", "a"), D("da2", "a"), D("da3", "a"), P("pb", "b"), D("db", "b"),
		C("s1", `"combined": true`), C("s2", `"combined": true`), C("s3", `"combined": true`))
	models := latency.New(latency.Options{Clock: h.clock})
	h.deps.Outcomes.Subscribe(models)
	h.c = New(Options{Deps: h.deps, Gateway: gw, Models: models})
	det := health.New(health.Options{Config: config.DefaultOutlier(), Store: h.store})
	rec := outcome.NewRecorder(nil)
	rec.Subscribe(det)
	res, err := config.NewResolver(config.Gateway{PD: gw, DefaultStrategy: StrategyPredictive}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if h.router, err = picker.NewRouter(picker.RouterOptions{Resolver: res, Strategies: Strategies(h.c, h.deps, gw), Health: det}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"da2", "s2"} {
		rec.Probe(outcome.Probe{Endpoint: h.key(name), Err: errors.New("refused"), Refused: true, ServingPort: true})
		if !det.Ejected(h.key(name)) {
			t.Fatalf("%s not ejected", name)
		}
	}
	// Both prefill pods have 10 s of prefill booked (the test's routes): a pair misses a
	// 500 ms TTFT objective, so requests run whole.
	for _, p := range []string{"pa", "pb"} {
		tr := h.deps.Outcomes.Start(outcome.KindPD, h.key(p), h.key("db"), 10)
		models.Charge(tr.ID(), latency.Charge{Kind: outcome.KindPD, Prefill: h.key(p), Destination: h.key("db"), Service: 10})
	}
	seen := map[picker.Outcome]int{}
	check := func(hd map[string]string) {
		for range 5 {
			d, err := h.pick(prompt("q", 200), hd)
			if err != nil {
				t.Fatalf("%v: %v", hd, err)
			}
			seen[d.Outcome]++
			for _, e := range d.Destination {
				if e.Role == pool.RolePrefill {
					t.Errorf("%v: %s decision names the prefill-only pod %s: %v", hd, d.Outcome, e.Name, names(d.Destination))
				}
				if det.Ejected(e.Key()) {
					t.Errorf("%v: %s decision names the ejected pod %s: %v", hd, d.Outcome, e.Name, names(d.Destination))
				}
				if d.Outcome == picker.OutcomeLocal && e.Role != pool.RoleDecode ||
					d.Outcome == picker.OutcomeCombined && (e.Role == pool.RoleDecode || e.Role == pool.RolePrefill) {
					t.Errorf("%v: %s decision falls back to %s (%q)", hd, d.Outcome, e.Name, e.Role)
				}
			}
			d.Lifecycle.Done(nil)
		}
	}
	check(map[string]string{wire.HeaderSLOTTFT: "500"}) // a decode pod runs it
	check(map[string]string{})                          // no objective: whatever is cheapest
	// The decode pods each decode a request of 100k tokens (the test's routes): their step
	// passes 80 % of a 13 ms TPOT objective, a standard pod's does not.
	for _, d := range []string{"da1", "da3", "db"} {
		h.deps.Outcomes.Start(outcome.KindWhole, "", h.key(d), 100000)
	}
	check(map[string]string{wire.HeaderSLOTTFT: "500", wire.HeaderSLOTPOT: "13"})
	if seen[picker.OutcomeLocal] == 0 || seen[picker.OutcomeCombined] == 0 {
		t.Errorf("outcomes %v: the test must see a prompt run on a decode pod and on a standard pod", seen)
	}
}
