package pd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// The decision names the decode pod first with fallbacks from its roleset, the prefill pod
// with its own, sets x-prefiller-host-port and echoes the strategy.
func TestDecisionShape(t *testing.T) {
	h := newHarness(t, gateway(nil), P("pA1", "A"), P("pA2", "A"), P("pA3", "A"), P("pA4", "A"),
		D("dA1", "A"), D("dA2", "A"), D("dA3", "A"), D("dA4", "A"), P("pB", "B"), D("dB", "B"))
	for range 20 {
		d := h.mustPick(prompt("x", 8))
		if d.Strategy != "pd" || d.ResponseHeaders["routing-strategy"] != "pd" || d.Outcome != picker.OutcomePD {
			t.Fatalf("strategy %q header %v outcome %s", d.Strategy, d.ResponseHeaders, d.Outcome)
		}
		if d.SetHeaders[HeaderPrefillerHostPort] != d.Prefill[0].HostPort() {
			t.Fatalf("header %v, prefill %s", d.SetHeaders, d.Prefill[0].HostPort())
		}
		rs := d.Destination[0].Roleset
		if len(d.Destination) > 3 || len(d.Prefill) > 3 {
			t.Fatalf("too many fallbacks: %v %v", names(d.Destination), names(d.Prefill))
		}
		if rs == "A" && (len(d.Destination) != 3 || len(d.Prefill) != 3) {
			t.Fatalf("roleset A has 4 pods a side: want primary + 2 fallbacks, got %v %v", names(d.Destination), names(d.Prefill))
		}
		for _, e := range d.Destination {
			if e.Role != pool.RoleDecode || e.Roleset != rs {
				t.Fatalf("destination %v strays from decode pods of %s", names(d.Destination), rs)
			}
		}
		for _, e := range d.Prefill {
			if e.Role != pool.RolePrefill || e.Roleset != rs {
				t.Fatalf("prefill %v strays from prefill pods of %s", names(d.Prefill), rs)
			}
		}
		d.Lifecycle.Done(nil)
	}
}

// Trackers: pick → prefill in flight + pending decode; response headers → running;
// Done → all released once, and one completion in the drain rate.
func TestLifecycleTrackers(t *testing.T) {
	h := newHarness(t, gateway(nil), P("pA", "A"), D("dA", "A"))
	pk, dk := h.key("pA"), h.key("dA")
	state := func() [3]int64 {
		return [3]int64{h.c.PrefillInFlight(pk), h.c.PendingDecode(dk), h.deps.Running.InFlight(dk)}
	}
	d := h.mustPick(prompt("x", 8))
	if got := state(); got != [3]int64{1, 1, 0} {
		t.Fatalf("after pick %v", got)
	}
	if _, has := h.deps.Running.Lookup(dk); has {
		t.Fatal("the decode pod has a running metric before it ever answered")
	}
	d.Lifecycle.ResponseHeaders(200, d.Destination[0])
	if got := state(); got != [3]int64{0, 0, 1} {
		t.Fatalf("after response headers %v", got)
	}
	d.Lifecycle.Done(nil)
	d.Lifecycle.Done(errors.New("again"))
	if got := state(); got != [3]int64{0, 0, 0} {
		t.Fatalf("after done %v", got)
	}
	if r := h.deps.Drain.PerSecond(dk); r != 1.0/60 {
		t.Fatalf("drain %v, want one completion per minute", r)
	}

	// An EPP hand-off ends the prefill leg on its own; a request cut before any response
	// releases everything at Done.
	d = h.mustPick(prompt("x", 8))
	d.Lifecycle.(PrefillObserver).PrefillDone(nil)
	if got := state(); got != [3]int64{0, 1, 0} {
		t.Fatalf("after prefill done %v", got)
	}
	d.Lifecycle.Done(context.Canceled)
	if got := state(); got != [3]int64{0, 0, 0} {
		t.Fatalf("after cancel %v", got)
	}
}

// When the gateway reports that a fallback served the request, the fallback is counted.
func TestServedFallbackIsCounted(t *testing.T) {
	h := newHarness(t, gateway(nil), P("pA", "A"), D("dA1", "A"), D("dA2", "A"))
	d := h.mustPick(prompt("x", 8))
	if len(d.Destination) != 2 {
		t.Fatalf("destination %v", names(d.Destination))
	}
	fb := d.Destination[1]
	d.Lifecycle.ResponseHeaders(200, fb)
	if h.deps.Running.InFlight(fb.Key()) != 1 || h.deps.Running.InFlight(d.Destination[0].Key()) != 0 {
		t.Fatal("running not counted on the serving fallback")
	}
	d.Lifecycle.Done(nil)
	if h.deps.Running.InFlight(fb.Key()) != 0 || h.deps.Drain.PerSecond(fb.Key()) == 0 {
		t.Fatal("fallback not released or its completion not recorded")
	}
}

// A decode pod leaving mid-traffic: requests in flight to it finish cleanly, its roleset
// becomes incomplete and is skipped, and its counters are forgotten.
func TestDecodePodGoesAwayMidTraffic(t *testing.T) {
	pods := []pod{P("pA", "A"), D("dA", "A"), P("pB", "B"), D("dB", "B")}
	h := newHarness(t, gateway(func(g *config.PD) { g.PrefillScorePolicy = PolicyLeastRequest }), pods...)
	dAKey := h.key("dA")
	var inflight []*picker.Decision
	started := map[string]bool{}
	for range 8 {
		d := h.mustPick(prompt("x", 8))
		// The first request to each decode pod starts decoding; the later ones' decodes have not
		// started: pending on their decode pod (whatever order the picks alternate in).
		if dst := first(d.Destination); !started[dst] {
			started[dst] = true
			d.Lifecycle.ResponseHeaders(200, nil)
		}
		inflight = append(inflight, d)
	}
	if h.deps.Running.InFlight(dAKey) == 0 || h.c.PendingDecode(dAKey) == 0 {
		t.Fatal("setup: nothing went to dA, or none of it is pending")
	}
	h.departed(pods[0], pods[2], pods[3]) // dA is gone
	for range 50 {
		d := h.mustPick(prompt("x", 8))
		if first(d.Destination) != "dB" || first(d.Prefill) != "pB" {
			t.Fatalf("picked %s/%s after dA left", first(d.Prefill), first(d.Destination))
		}
		d.Lifecycle.Done(nil)
	}
	for _, d := range inflight {
		d.Lifecycle.Done(nil)
	}
	_, pending := h.c.Trackers()
	if _, has := h.deps.Running.Lookup(dAKey); has {
		t.Fatal("the departed pod's running counter was kept")
	}
	if _, has := pending.Lookup(dAKey); has {
		t.Fatal("the departed pod's pending-decode counter was kept")
	}
	for _, k := range []string{h.key("pA"), h.key("pB"), h.key("dB")} {
		if h.c.PrefillInFlight(k) != 0 || h.c.PendingDecode(k) != 0 || h.deps.Running.InFlight(k) != 0 {
			t.Fatalf("%s: counters not back to zero", k)
		}
	}
}

// Requests that are not completions go to a non-prefill pod by least-request.
func TestNonInferenceRequest(t *testing.T) {
	h := newHarness(t, gateway(nil), P("pA", "A"), D("dA", "A"))
	req, err := request.Parse("GET", "/v1/models", map[string]string{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap := h.store.Load()
	for range 10 {
		d, err := h.router.Schedule(context.Background(), req, snap, snap.Endpoints)
		if err != nil || first(d.Destination) != "dA" || len(d.Prefill) != 0 || d.Step != StepNonInference {
			t.Fatalf("%v %+v", err, d)
		}
		// The response names the strategy that ran, as the trace does, not the pd that delegated.
		if got := d.ResponseHeaders[wire.HeaderRoutingStrategy]; got != picker.StrategyLeastRequest || d.Trace.Steps[0] != got {
			t.Fatalf("%s: %q, trace %v", wire.HeaderRoutingStrategy, got, d.Trace.Steps)
		}
		// Its scores are a scorer chain's weighted totals, which read the other way from pd's costs.
		if len(d.Trace.Scores) == 0 || d.Trace.ScoreDirection != picker.HigherIsBetter {
			t.Fatalf("scores %v, direction %q", d.Trace.Scores, d.Trace.ScoreDirection)
		}
		d.Lifecycle.Done(nil)
	}
}

// llm-d manifests work unchanged: llm-d.ai/role without roleset-name pairs any prefill pod
// with any decode pod, and prefill-decode pods are combined fallbacks.
func TestLLMDLabels(t *testing.T) {
	llmd := func(name, role string) pod {
		return pod{name: name, labels: map[string]string{pool.LabelLLMDRole: role}}
	}
	h := newHarness(t, gateway(nil), llmd("p", "prefill"), llmd("d", "decode"), llmd("both", "prefill-decode"))
	d := h.mustPick(prompt("x", 8))
	if first(d.Prefill) != "p" || first(d.Destination) != "d" {
		t.Fatalf("%v %v", names(d.Prefill), names(d.Destination))
	}
	h.publish(llmd("p", "prefill"), llmd("both", "both"))
	d = h.mustPick(prompt("x", 8))
	if d.Outcome != picker.OutcomeCombined || first(d.Destination) != "both" || d.Step != StepCombinedNoRoleset {
		t.Fatalf("%s %s %v", d.Outcome, d.Step, names(d.Destination))
	}
}

// Property test over random pools: whatever the pool, loads, metrics and knobs, a PD pair
// never spans two rolesets, a prefill-only pod is never a destination, a combined outcome
// never carries a prefill target, and an error only comes when no pair or combined pod fits.
func TestRandomPoolsProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 400 {
		var pods []pod
		nRS := 1 + rng.IntN(12)
		for r := range nRS {
			rs := fmt.Sprintf("rs%d", r)
			for i := range rng.IntN(4) {
				p := P(fmt.Sprintf("p%d-%d", r, i), rs)
				if rng.IntN(3) == 0 {
					p = p.rng(rng.IntN(200), rng.IntN(400))
				}
				pods = append(pods, p)
			}
			for i := range rng.IntN(4) {
				d := D(fmt.Sprintf("d%d-%d", r, i), rs)
				if rng.IntN(3) == 0 {
					d = d.rng(rng.IntN(200), rng.IntN(400))
				}
				pods = append(pods, d)
			}
		}
		for i := range rng.IntN(3) {
			pods = append(pods, C(fmt.Sprintf("c%d", i), fmt.Sprintf(`"promptLenBucketMinLength": %d`, rng.IntN(300))))
		}
		if rng.IntN(4) == 0 {
			pods = append(pods, pod{name: "plain"}) // a standard pod that is not combined
		}
		if len(pods) == 0 {
			continue
		}
		policiesP := []string{PolicyPrefixCache, PolicyLeastRequest, PolicyConductor}
		policiesD := []string{PolicyLoadBalancing, PolicyLeastRequest, PolicyConductor}
		gw := gateway(func(g *config.PD) {
			g.PromptLengthBucketing = rng.IntN(2) == 0
			g.PrefillScorePolicy = policiesP[rng.IntN(3)]
			g.DecodeScorePolicy = policiesD[rng.IntN(3)]
			g.PrefillLoadImbalanceMinSpread = float64(rng.IntN(6))
			g.DecodeLoadImbalanceMinSpread = float64(rng.IntN(6))
			g.DecodeThroughputImbalanceMinSpread = float64(rng.IntN(3000))
			g.PrefixCache.StandardDeviationFactor = rng.Float64() * 2
		})
		h := newHarness(t, gw, pods...)
		for _, p := range pods {
			switch rng.IntN(4) {
			case 0:
				h.prefillInFlight(p.name, rng.IntN(10))
			case 1:
				h.running(p.name, rng.IntN(30))
			case 2:
				h.sample(p.name, metrics.Sample{GenThroughput: rng.Float64() * 5000, HasGenThroughput: true,
					KVUsage: rng.Float64(), HasKVUsage: true, Waiting: float64(rng.IntN(5)), HasWaiting: true})
			case 3:
				h.completions(p.name, rng.IntN(120))
			}
		}
		for range 5 {
			d, err := h.pick(prompt("z", 1+rng.IntN(400)), nil)
			if err != nil {
				var ae *apierror.Error
				if !errors.As(err, &ae) || ae.Status != 503 {
					t.Fatalf("iter %d: %v", iter, err)
				}
				continue
			}
			for _, e := range d.Destination {
				if e.Role == pool.RolePrefill {
					t.Fatalf("iter %d: prefill pod %s is a destination", iter, e.Name)
				}
			}
			switch d.Outcome {
			case picker.OutcomePD:
				// Fallbacks: decode pods of the pair's roleset, then standard pods, never a
				// decode pod of another roleset.
				rs := d.Destination[0].Roleset
				standard := false
				for _, e := range append(append([]*pool.Endpoint{}, d.Destination...), d.Prefill...) {
					if e.Role == pool.RoleStandard {
						standard = true
						continue
					}
					if e.Roleset != rs || (standard && e.Role == pool.RoleDecode) {
						t.Fatalf("iter %d: pair spans rolesets: %v / %v", iter, names(d.Destination), names(d.Prefill))
					}
				}
				if len(d.Prefill) == 0 || d.Prefill[0].Role != pool.RolePrefill {
					t.Fatalf("iter %d: no prefill target", iter)
				}
			case picker.OutcomeCombined:
				if len(d.Prefill) != 0 || d.Destination[0].Role != pool.RoleStandard {
					t.Fatalf("iter %d: combined decision %v / %v", iter, names(d.Destination), names(d.Prefill))
				}
			default:
				t.Fatalf("iter %d: outcome %s", iter, d.Outcome)
			}
			if rng.IntN(2) == 0 {
				d.Lifecycle.Done(nil)
			}
		}
	}
}

// Selection and registration share one critical section: 256 concurrent picks on 4 idle
// rolesets with least_request land exactly 64 each (the seed's #2678 burst).
func TestConcurrentBurstSeesPriorPicks(t *testing.T) {
	h := newHarness(t, gateway(func(g *config.PD) {
		g.PrefillScorePolicy = PolicyLeastRequest
		g.DecodeScorePolicy = PolicyLeastRequest
	}), P("p0", "0"), D("d0", "0"), P("p1", "1"), D("d1", "1"), P("p2", "2"), D("d2", "2"), P("p3", "3"), D("d3", "3"))
	// Yield between reading the counters and registering the pick, so that, were the two
	// not in one critical section, other picks would read the same stale counters.
	h.c.afterScoring = func() {
		for range 3 {
			runtime.Gosched()
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	var ds []*picker.Decision
	for range 256 {
		wg.Go(func() {
			d := h.mustPick(prompt("x", 8))
			mu.Lock()
			got[first(d.Prefill)]++
			ds = append(ds, d)
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, p := range []string{"p0", "p1", "p2", "p3"} {
		if got[p] != 64 {
			t.Fatalf("burst split %v, want 64 each", got)
		}
	}
	for _, d := range ds {
		d.Lifecycle.Done(nil)
	}
}

// Concurrent picks, completions and pool changes under -race; counters end at zero.
func TestConcurrentPicksAndPoolChanges(t *testing.T) {
	pods := []pod{P("pA", "A"), D("dA", "A"), P("pB", "B"), D("dB", "B"), C("c", "")}
	h := newHarness(t, gateway(func(g *config.PD) { g.PromptLengthBucketing = true }), pods...)
	// Resolve keys before the snapshot churns.
	var keys []string
	for _, p := range pods {
		keys = append(keys, h.key(p.name))
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				d, err := h.pick(prompt(fmt.Sprintf("w%d-%d ", w, i%7), 40), nil)
				if err != nil {
					continue
				}
				d.Lifecycle.ResponseHeaders(200, nil)
				d.Lifecycle.Done(nil)
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			if i%2 == 0 {
				h.store.Publish(pool.Info{}, h.store.Load().Endpoints[1:], true)
			} else {
				h.publish(pods...)
			}
		}
	})
	wg.Wait()
	for _, k := range keys {
		if h.c.PrefillInFlight(k) != 0 || h.c.PendingDecode(k) != 0 || h.deps.Running.InFlight(k) != 0 {
			t.Fatalf("%s: counters not back to zero", k)
		}
	}
}
