package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/predictive_decisions.golden from today's pd-predictive")

const predictiveGolden = "testdata/predictive_decisions.golden"

// pd-predictive decides as it did when its pick was made cheaper (the golden file was
// written by the code before that work): on seeded random pools (rolesets complete and
// not, standard pods, bucket ranges), random objectives (headers, sheddable profiles),
// random prompts sharing prefixes, random load and scraped samples, and request lifecycles
// that feed the latency models (prefill ends, first bytes, chunks, ends) on a manual clock,
// every pick's decision — destination, fallbacks, prefill, step, headers, trace with its
// predictions and the deciders' notes, error — and the models' ledgers and fitted
// coefficients after it hash as recorded. Regenerate with -update only for a change that is
// meant to alter decisions.
func TestPredictiveDecisionsUnchanged(t *testing.T) {
	var got []string
	kinds := map[string]int{}
	for scenario := range 60 {
		got = append(got, predictiveScenario(t, scenario, kinds)...)
	}
	t.Logf("%d picks: %v", len(got), kinds)
	for _, k := range []string{string(picker.OutcomePD), string(picker.OutcomeLocal), string(picker.OutcomeCombined), "error"} {
		if kinds[k] < 20 {
			t.Fatalf("outcomes %v: the scenarios should exercise every kind (%s)", kinds, k)
		}
	}
	path := filepath.FromSlash(predictiveGolden)
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (write it with go test ./bench/picker -run TestPredictiveDecisionsUnchanged -update)", err)
	}
	defer f.Close()
	var want []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		want = append(want, sc.Text())
	}
	if len(want) != len(got) {
		t.Fatalf("%d picks recorded, %d made", len(want), len(got))
	}
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("first difference at %q, recorded %q", got[i], want[i])
		}
	}
}

// predictiveScenario runs one scenario and returns a line per pick: "scenario pick hash".
func predictiveScenario(t *testing.T, scenario int, kinds map[string]int) []string {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(scenario), 1818))
	clock := load.NewManualClock(time.Unix(1_700_000_000, 0))
	gw := config.DefaultPD()
	gw.PrefixCache.BlockSize = 4
	gw.PromptLengthBucketing = rng.IntN(3) == 0
	deps := picker.NewDeps(clock, gw.PrefixCache)
	drng := rand.New(rand.NewPCG(uint64(scenario), 77))
	deps.Rand = func(n int) int { return drng.IntN(n) }
	m := latency.New(latency.Options{Clock: clock, Samples: deps.Metrics.Get})
	deps.Outcomes.Subscribe(m)
	c := pd.New(pd.Options{Deps: deps, Gateway: gw, Models: m})
	res, err := config.NewResolver(config.Gateway{PD: gw, DefaultStrategy: pd.StrategyPredictive}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	router, err := picker.NewRouter(picker.RouterOptions{Resolver: res, Strategies: pd.Strategies(c, deps, gw)})
	if err != nil {
		t.Fatal(err)
	}
	eps := randomPool(rng)
	if rng.IntN(2) == 0 { // standard pods, sometimes sheddable
		for i := range 1 + rng.IntN(3) {
			rc := `"combined": true`
			if rng.IntN(3) == 0 {
				rc += `, "sheddable": true`
			}
			eps = append(eps, pool.NewEndpoint("ns", fmt.Sprintf("s%d", i), fmt.Sprintf("10.2.0.%d", i+1), 8000, 0,
				map[string]string{pool.LabelModelName: "m"},
				map[string]string{pool.AnnotationConfig: `{"profiles": {"default": {"routingConfig": {` + rc + `}}}}`}))
		}
	}
	snap := pool.NewStore().Publish(pool.Info{Name: "p"}, eps, true)
	type live struct {
		d       *picker.Decision
		left    int // lifecycle events still to come
		started bool
	}
	var inflight []*live
	var lines []string
	for step := range 60 {
		// Load and samples.
		e := eps[rng.IntN(len(eps))]
		switch rng.IntN(5) {
		case 0:
			deps.Running.Start(e.Key())
		case 1:
			deps.Drain.Record(e.Key())
		case 2:
			hs := prefix.Hash(nil, promptOf(step%5, 256), prefix.BlockBytes(4))
			deps.Prefix.Add("m", hs[:rng.IntN(len(hs)+1)], e.Key())
		case 3:
			deps.Metrics.Put(e.Key(), &metrics.Sample{Running: float64(rng.IntN(8)), HasRunning: true,
				Waiting: float64(rng.IntN(5)), HasWaiting: true, KVUsage: rng.Float64(), HasKVUsage: true,
				NumGPUBlocks: 1000, BlockSize: 16, GenThroughput: float64(rng.IntN(3000)), HasGenThroughput: rng.IntN(2) == 0,
				PrefillTimeMean: 0.01 + rng.Float64()*0.2, PrefillCount: float64(rng.IntN(3)), HasPrefillTimeMean: rng.IntN(2) == 0,
				InterTokenMean: 0.005 + rng.Float64()*0.03, InterTokenCount: float64(rng.IntN(3)), HasInterTokenMean: rng.IntN(2) == 0,
				UpdatedAt: clock.Now()})
		}
		headers := map[string]string{}
		if rng.IntN(3) > 0 {
			headers[wire.HeaderSLOTTFT] = fmt.Sprint(50 + rng.IntN(2000))
		}
		if rng.IntN(3) > 0 {
			headers[wire.HeaderSLOTPOT] = fmt.Sprint(5 + rng.IntN(80))
		}
		if rng.IntN(25) == 0 {
			headers[wire.HeaderSLOTTFT] = "soon" // a 400
		}
		r := goldenRequest(t, promptOf(rng.IntN(5), 8+rng.IntN(4000)), 1+rng.IntN(300), headers)
		d, err := router.Schedule(context.Background(), r, snap, snap.Endpoints)
		o := outcomeOf(d, err)
		state := ""
		if err == nil {
			kinds[string(d.Outcome)]++
			for _, e := range slices.Concat(d.Destination, d.Prefill) {
				backlog, charges := m.Local(e.Key(), clock.Now())
				state += fmt.Sprintf(" %s:%x/%d", e.Key(), backlog, charges)
			}
			inflight = append(inflight, &live{d: d, left: 1 + rng.IntN(4)})
		} else {
			kinds["error"]++
		}
		keys := m.Keys()
		slices.Sort(keys)
		for _, k := range keys {
			if strings.HasSuffix(k, "0") || step == 59 { // some pods each pick, every pod at the end
				state += fmt.Sprintf(" %s%+v", k, m.Coefficients(k))
			}
		}
		j, _ := json.Marshal(o)
		sum := sha256.Sum256(append(j, state...))
		lines = append(lines, fmt.Sprintf("%d %d %x", scenario, step, sum[:8]))

		// Time passes; requests progress: a PD route's prefill leg ends, first bytes,
		// chunks, ends.
		clock.Advance(time.Duration(rng.IntN(60)) * time.Millisecond)
		for len(inflight) > 0 && rng.IntN(3) > 0 {
			i := rng.IntN(len(inflight))
			l := inflight[i]
			lc := l.d.Lifecycle
			switch {
			case l.left > 1:
				if po, ok := lc.(pd.PrefillObserver); ok && l.d.Outcome == picker.OutcomePD && rng.IntN(2) == 0 {
					po.PrefillDone(nil)
				}
				if !l.started {
					lc.ResponseHeaders(200, nil)
					l.started = true
				}
				lc.ResponseBody(16, false)
				l.left--
				clock.Advance(time.Duration(rng.IntN(20)) * time.Millisecond)
				continue
			case rng.IntN(8) == 0:
				lc.Done(fmt.Errorf("reset"))
			default:
				if !l.started {
					lc.ResponseHeaders(200, nil)
				}
				for range 4 {
					lc.ResponseBody(16, false)
					clock.Advance(time.Duration(rng.IntN(10)) * time.Millisecond)
				}
				lc.Done(nil)
			}
			inflight = slices.Delete(inflight, i, i+1)
		}
	}
	for _, l := range inflight {
		l.d.Lifecycle.Done(nil)
	}
	return lines
}

func goldenRequest(t *testing.T, text string, maxTokens int, headers map[string]string) *request.Request {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": text, "max_tokens": maxTokens})
	r, err := request.Parse("POST", "/v1/completions", headers, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
