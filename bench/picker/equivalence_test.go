package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/bench/picker/baseline"
	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
	"github.com/tandem-epp/tandem/internal/request"
)

// world is one Tandem picker: the frozen cascade (baseline) or today's chain, over its own
// dependencies on a manual clock, with every random choice from a source seeded alike.
type world struct {
	deps    *picker.Deps
	clock   *load.ManualClock
	router  *picker.Router
	inFlPre func(string) int64
}

// preferMiddle is a step-2b preference both worlds share: the middle roleset offered.
type preferMiddle struct{}

func (*preferMiddle) Prefer(_ *picker.Cycle, rolesets []string) (string, bool) {
	if len(rolesets) < 2 {
		return "", false
	}
	return rolesets[len(rolesets)/2], true
}

func newWorld(t *testing.T, gw config.PD, seed uint64, chain bool, prefer *preferMiddle) *world {
	t.Helper()
	clock := load.NewManualClock(time.Unix(1_700_000_000, 0))
	deps := picker.NewDeps(clock, gw.PrefixCache)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e37))
	deps.Rand = func(n int) int { return rng.IntN(n) }
	var strategies []picker.Strategy
	w := &world{deps: deps, clock: clock}
	if chain {
		c := pd.New(pd.Options{Deps: deps, Gateway: gw, Preference: prefer})
		strategies = pd.Strategies(c, deps, gw)
		w.inFlPre = c.PrefillInFlight
	} else {
		c := baseline.New(baseline.Options{Deps: deps, Gateway: gw, Preference: prefer})
		strategies = []picker.Strategy{c, picker.NewRandom(deps), picker.NewLeastRequestStrategy(deps), picker.NewPrefixCache(deps, gw)}
		w.inFlPre = c.PrefillInFlight
	}
	res, err := config.NewResolver(config.Gateway{PD: gw, DefaultStrategy: pd.StrategyName}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if w.router, err = picker.NewRouter(picker.RouterOptions{Resolver: res, Strategies: strategies}); err != nil {
		t.Fatal(err)
	}
	return w
}

// outcome is everything a decision shows: who, why and how it was traced.
type outcome struct {
	Err                 string
	Outcome, Step       string
	Destination, Prefil []string
	Headers             map[string]string
	Trace               *picker.Trace
}

func outcomeOf(d *picker.Decision, err error) outcome {
	if err != nil {
		ae := apierror.From(err)
		return outcome{Err: fmt.Sprintf("%d %s", ae.Status, ae.Reason)}
	}
	o := outcome{Outcome: string(d.Outcome), Step: d.Step, Headers: d.SetHeaders, Trace: d.Trace}
	if d.Trace != nil && d.Trace.ScoreDirection != "" {
		// The frozen cascade and the golden record predate score_direction, which labels the
		// scores and decides nothing: compare the trace without it.
		tr := *d.Trace
		tr.ScoreDirection = ""
		o.Trace = &tr
	}
	for _, e := range d.Destination {
		o.Destination = append(o.Destination, e.Name)
	}
	for _, e := range d.Prefill {
		o.Prefil = append(o.Prefil, e.Name)
	}
	return o
}

// liveOutcomeOf is outcomeOf for today's chain, less what the frozen cascade never had: a PD
// pair's fallbacks end with the standard pods whose bucket covers the prompt (issue 12's PD-safe
// fallbacks), after the roleset's decode pods.
func liveOutcomeOf(d *picker.Decision, err error) outcome {
	o := outcomeOf(d, err)
	if err != nil || d.Outcome != picker.OutcomePD {
		return o
	}
	o.Destination = o.Destination[:0]
	for _, e := range d.Destination {
		if e.Role == pool.RoleDecode {
			o.Destination = append(o.Destination, e.Name)
		}
	}
	return o
}

// The chain decides exactly as the cascade it replaced: on random pools (rolesets complete
// and not, combined pods, bucket ranges), random knobs (policies, bucketing, spreads that
// make the fast paths fire, the standard-deviation factor) and random live load (running,
// pending, prefill in flight, drain rates, scraped metrics, prefix warms), a sequence of
// picks and completions applied alike to both gives the same decisions — destination,
// fallbacks, prefill, step, trace and error — with the same random source.
func TestChainDecidesAsTheFrozenCascade(t *testing.T) {
	prefillPolicies := []string{pd.PolicyPrefixCache, pd.PolicyLeastRequest, pd.PolicyConductor}
	decodePolicies := []string{pd.PolicyLoadBalancing, pd.PolicyLeastRequest, pd.PolicyConductor}
	compared, pairs, fast, combined, failed, banded, relaxed := 0, 0, 0, 0, 0, 0, 0
	for scenario := range 120 {
		rng := rand.New(rand.NewPCG(uint64(scenario), 99))
		gw := config.DefaultPD()
		gw.PrefixCache.BlockSize = 4
		gw.PrefillScorePolicy = prefillPolicies[rng.IntN(3)]
		gw.DecodeScorePolicy = decodePolicies[rng.IntN(3)]
		gw.PromptLengthBucketing = rng.IntN(2) == 0
		if rng.IntN(2) == 0 { // spreads small enough for the fast paths to fire; else the seed's
			gw.PrefillLoadImbalanceMinSpread = float64(rng.IntN(4))
			gw.DecodeLoadImbalanceMinSpread = float64(1 + rng.IntN(6))
			gw.DecodeThroughputImbalanceMinSpread = float64(rng.IntN(800))
		}
		gw.PrefixCache.StandardDeviationFactor = []float64{-1, 0, 0.5, 1}[rng.IntN(4)]
		var prefer preferMiddle
		if gw.PromptLengthBucketing && rng.IntN(2) == 0 {
			gw.BucketServe = true
		}
		a, b := newWorld(t, gw, uint64(scenario), false, &prefer), newWorld(t, gw, uint64(scenario), true, &prefer)

		eps := randomPool(rng)
		snapA := pool.NewStore().Publish(pool.Info{Name: "p"}, eps, true)
		snapB := pool.NewStore().Publish(pool.Info{Name: "p"}, eps, true)
		for _, e := range eps {
			if rng.IntN(3) == 0 {
				continue // never scraped
			}
			smp := metrics.Sample{Running: float64(rng.IntN(8)), HasRunning: true,
				Waiting: float64(rng.IntN(5)), HasWaiting: true, KVUsage: rng.Float64(), HasKVUsage: rng.IntN(4) > 0,
				GenThroughput: float64(rng.IntN(3000)), HasGenThroughput: rng.IntN(3) > 0}
			for _, w := range []*world{a, b} {
				cp := smp
				w.deps.Metrics.Put(e.Key(), &cp)
			}
		}
		rng2 := rand.New(rand.NewPCG(uint64(scenario), 7)) // the same load for both worlds
		var live [2][]*picker.Decision
		for step := range 40 {
			// Load that both worlds see alike.
			e := eps[rng2.IntN(len(eps))]
			switch rng2.IntN(4) {
			case 0:
				a.deps.Running.Start(e.Key())
				b.deps.Running.Start(e.Key())
			case 1:
				a.deps.Drain.Record(e.Key())
				b.deps.Drain.Record(e.Key())
			case 2:
				hs := prefix.Hash(nil, promptOf(step%5, 64), prefix.BlockBytes(4))
				n := rng2.IntN(len(hs) + 1)
				a.deps.Prefix.Add("m", hs[:n], e.Key())
				b.deps.Prefix.Add("m", hs[:n], e.Key())
			}
			text := promptOf(rng2.IntN(5), 8+rng2.IntN(300))
			path := "/v1/completions"
			if rng2.IntN(15) == 0 {
				path = "/v1/models"
			}
			da, errA := a.router.Schedule(context.Background(), req(t, path, text), snapA, snapA.Endpoints)
			db, errB := b.router.Schedule(context.Background(), req(t, path, text), snapB, snapB.Endpoints)
			oa, ob := outcomeOf(da, errA), liveOutcomeOf(db, errB)
			if !reflect.DeepEqual(oa, ob) {
				ja, _ := json.Marshal(oa)
				jb, _ := json.Marshal(ob)
				t.Fatalf("scenario %d pick %d (gw %+v):\ncascade %s\nchain   %s", scenario, step, gw, ja, jb)
			}
			compared++
			switch {
			case errA != nil:
				failed++
				continue
			case da.Outcome == picker.OutcomeCombined:
				combined++
			case da.Outcome == picker.OutcomePD:
				pairs++
				if da.Step != pd.StepPair {
					fast++
				}
				if strings.Contains(da.Step, pd.StepBucketServe) {
					banded++
				}
				if slices.Contains(da.Trace.Steps, "stddev_skip_ignored") {
					relaxed++
				}
			}
			live[0], live[1] = append(live[0], da), append(live[1], db)
			// Complete some requests, in the same order in both worlds.
			for len(live[0]) > 0 && rng2.IntN(3) == 0 {
				i := rng2.IntN(len(live[0]))
				for w := range live {
					d := live[w][i]
					d.Lifecycle.ResponseHeaders(200, nil)
					d.Lifecycle.Done(nil)
					live[w] = append(live[w][:i], live[w][i+1:]...)
				}
			}
			if a.inFlPre(eps[0].Key()) != b.inFlPre(eps[0].Key()) {
				t.Fatalf("scenario %d: prefill trackers diverged", scenario)
			}
			a.clock.Advance(time.Second)
			b.clock.Advance(time.Second)
		}
	}
	t.Logf("%d picks compared: %d pairs (%d by a fast path or bucket serving, %d banded, %d with the skip lifted), %d combined, %d errors",
		compared, pairs, fast, banded, relaxed, combined, failed)
	if pairs < 1000 || fast < 100 || pairs-fast < 500 || banded < 20 || combined < 50 || failed < 10 {
		t.Fatalf("the scenarios do not exercise every path: %d pairs, %d fast, %d combined, %d errors", pairs, fast, combined, failed)
	}
}

func promptOf(prefix, tokens int) string {
	var b strings.Builder
	for b.Len() < 4*tokens {
		fmt.Fprintf(&b, "p%d-%d ", prefix, b.Len()%97)
	}
	return b.String()[:4*tokens]
}

func req(t *testing.T, path, text string) *request.Request {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": text})
	r, err := request.Parse("POST", path, map[string]string{}, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// randomPool is 1–5 rolesets of 1–3 prefill and 1–3 decode pods (one side sometimes
// missing), some with bucket ranges, and 0–2 combined pods.
func randomPool(rng *rand.Rand) []*pool.Endpoint {
	var eps []*pool.Endpoint
	add := func(name string, labels map[string]string, routing string) {
		labels[pool.LabelModelName] = "m"
		ann := map[string]string{}
		if routing != "" {
			ann[pool.AnnotationConfig] = `{"profiles": {"default": {"routingConfig": {` + routing + `}}}}`
		}
		i := len(eps)
		eps = append(eps, pool.NewEndpoint("ns", name, fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), 8000, 0, labels, ann))
	}
	bucket := func() string {
		if rng.IntN(3) > 0 {
			return ""
		}
		lo := rng.IntN(100)
		return fmt.Sprintf(`"promptLenBucketMinLength": %d, "promptLenBucketMaxLength": %d`, lo, lo+50+rng.IntN(300))
	}
	for r := range 1 + rng.IntN(5) {
		rs := fmt.Sprintf("rs%d", r)
		np, nd := 1+rng.IntN(3), 1+rng.IntN(3)
		if rng.IntN(8) == 0 {
			np = 0
		}
		for i := range np {
			add(fmt.Sprintf("p%d-%d", r, i), map[string]string{pool.LabelRoleName: "prefill", pool.LabelRolesetName: rs}, bucket())
		}
		for i := range nd {
			add(fmt.Sprintf("d%d-%d", r, i), map[string]string{pool.LabelRoleName: "decode", pool.LabelRolesetName: rs}, bucket())
		}
	}
	for i := range rng.IntN(3) {
		rc := `"combined": true`
		if b := bucket(); b != "" {
			rc += ", " + b
		}
		add(fmt.Sprintf("c%d", i), map[string]string{}, rc)
	}
	rng.Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
	return eps
}
