package pd

import (
	"errors"
	"slices"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
)

// A PD pair's fallbacks are PD-safe: the other decode pods of its roleset (least loaded first),
// then combined pods whose bucket covers the prompt; never a prefill-only pod, never a decode
// pod of another roleset (its sidecar would pair it with this prefill pod), never a combined pod
// whose bucket misses the prompt.
func TestPairFallbacksArePDSafe(t *testing.T) {
	gw := gateway(func(g *config.PD) {
		g.PromptLengthBucketing = true
		g.PrefillScorePolicy, g.DecodeScorePolicy = PolicyLeastRequest, PolicyLeastRequest
	})
	h := newHarness(t, gw, P("pa", "a"), D("da1", "a"), D("da2", "a"), D("da3", "a"),
		P("pb", "b"), D("db", "b"),
		C("short", `"promptLenBucketMinLength": 0, "promptLenBucketMaxLength": 50`),
		C("any", ""), C("busy", ""))
	h.prefillInFlight("pb", 5) // the pair is rs-a
	h.running("da1", 0)        // seen, idle: the decode pick
	h.running("da2", 1)
	h.running("da3", 2)
	h.running("busy", 3)
	for _, c := range []struct {
		tokens int
		want   []string
	}{
		// 20 tokens: "short" covers it, "any" and "busy" too; least loaded first (ties in pool
		// order), two at most.
		{20, []string{"da1", "da2", "da3", "any", "short"}},
		// 200 tokens: "short" does not cover it.
		{200, []string{"da1", "da2", "da3", "any", "busy"}},
	} {
		d := h.mustPick(prompt("q", c.tokens))
		if d.Outcome != picker.OutcomePD || first(d.Prefill) != "pa" {
			t.Fatalf("%d tokens: outcome %s prefill %v", c.tokens, d.Outcome, names(d.Prefill))
		}
		if got := names(d.Destination); !slices.Equal(got, c.want) {
			t.Errorf("%d tokens: destination %v, want %v", c.tokens, got, c.want)
		}
		d.Lifecycle.Done(nil)
	}
}

// With passive health in the router, the pair and its fallbacks come only from endpoints in
// rotation: an ejected decode pod is neither the pick nor a fallback, and once every decode pod
// of the only roleset is ejected the combined pods serve.
func TestPairFallbacksSkipEjectedPods(t *testing.T) {
	gw := gateway(func(g *config.PD) { g.PrefillScorePolicy, g.DecodeScorePolicy = PolicyLeastRequest, PolicyLeastRequest })
	h := newHarness(t, gw, P("pa", "a"), D("da1", "a"), D("da2", "a"), C("s1", ""), C("s2", ""))
	det := health.New(health.Options{Config: config.DefaultOutlier(), Store: h.store})
	rec := outcome.NewRecorder(nil)
	rec.Subscribe(det)
	res, err := config.NewResolver(config.Gateway{PD: gw, DefaultStrategy: StrategyName}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if h.router, err = picker.NewRouter(picker.RouterOptions{Resolver: res, Strategies: Strategies(h.c, h.deps, gw), Health: det}); err != nil {
		t.Fatal(err)
	}
	refuse := func(name string) {
		rec.Probe(outcome.Probe{Endpoint: h.key(name), Err: errors.New("refused"), Refused: true, ServingPort: true})
	}
	refuse("da1")
	for range 10 {
		d := h.mustPick(prompt("q", 20))
		if d.Outcome != picker.OutcomePD || slices.Contains(names(d.Destination), "da1") {
			t.Fatalf("ejected da1 routed to: %s %v", d.Outcome, names(d.Destination))
		}
		if want := []string{"da2", "s1", "s2"}; !slices.Equal(slices.Sorted(slices.Values(names(d.Destination))), want) || first(d.Destination) != "da2" {
			t.Fatalf("destination %v, want da2 then the combined pods", names(d.Destination))
		}
		d.Lifecycle.Done(nil)
	}
	refuse("da2") // two of the four serving pods: the cap (50%) allows it
	if !det.Ejected(h.key("da2")) {
		t.Fatal("da2 not ejected")
	}
	d := h.mustPick(prompt("q", 20))
	if d.Outcome != picker.OutcomeCombined || len(d.Prefill) != 0 {
		t.Fatalf("every decode pod ejected: %s %v / %v", d.Outcome, names(d.Destination), names(d.Prefill))
	}
	d.Lifecycle.Done(nil)
}
