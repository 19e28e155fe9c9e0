package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/sim"
)

// tinyWorkload is the first n requests of a trace, offered at rate req/s.
func tinyWorkload(t *testing.T, name string, n int) *workload {
	t.Helper()
	dir, err := findData("")
	if err != nil {
		t.Skipf("traces not available: %v", err)
	}
	w, err := loadWorkload(dir, name, n, sim.Llama8BH100(), 7)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func runTiny(t *testing.T, w *workload, pol policy, rate float64) *runResult {
	t.Helper()
	c, err := parseCluster("2x1p1d+1s")
	if err != nil {
		t.Fatal(err)
	}
	res, err := simulate(w, c, pol, runOpts{params: sim.Llama8BH100(), scrape: 1, seed: 7, rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func byName(t *testing.T, name string) policy {
	i := slices.IndexFunc(allPolicies, func(p policy) bool { return p.name == name })
	if i < 0 {
		t.Fatalf("no policy %q", name)
	}
	return allPolicies[i]
}

// Sanity, for every policy the tree registers: every request completes with all its
// tokens, TTFT is at least the request's own prefill compute, and the first token comes
// before the last.
func TestEveryRequestCompletes(t *testing.T) {
	w := tinyWorkload(t, "mooncake", 40) // shared prefixes, long prompts
	p := sim.Llama8BH100()
	for _, pol := range allPolicies {
		t.Run(pol.name, func(t *testing.T) {
			c, _ := parseCluster("2x1p1d+1s")
			res, err := simulate(w, c, pol, runOpts{params: p, scrape: 1, seed: 7, rate: 2})
			if _, ok := err.(errNotRegistered); ok {
				t.Fatalf("policy not registered: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res.recs {
				if r.failed != "" {
					t.Fatalf("request %d failed: %s", i, r.failed)
				}
				if r.prefillC <= 0 || r.ttft() < r.prefillC-1e-9 {
					t.Fatalf("request %d: TTFT %.6f s < its prefill compute %.6f s", i, r.ttft(), r.prefillC)
				}
				if r.done < r.first || r.first < r.arrive {
					t.Fatalf("request %d: arrive %.6f first %.6f done %.6f out of order", i, r.arrive, r.first, r.done)
				}
			}
		})
	}
}

// An idle pod's TTFT is exactly its prefill time (plain) and E2E adds one decode step per
// further token, each attending to one more token: checkable by hand from internal/sim's model.
func TestIdlePodMatchesModel(t *testing.T) {
	w := tinyWorkload(t, "code", 3)
	p := sim.Llama8BH100()
	// Spread the three requests 1000 s apart so each finds an idle pod (rate 0: these times).
	for i := range w.reqs {
		w.reqs[i].at = float64(i) * 1000
	}
	res := runTiny(t, w, byName(t, "round-robin"), 0)
	for i, r := range res.recs {
		q := w.reqs[i]
		wantTTFT := sim.PrefillSeconds(p, q.prompt)
		wantE2E := wantTTFT
		for j := 0; j < q.out-1; j++ {
			wantE2E += sim.InterTokenSeconds(p, 1, q.prompt+j)
		}
		if d := r.ttft() - wantTTFT; d > 1e-9 || d < -1e-9 {
			t.Errorf("request %d (%d prompt tokens): TTFT %.9f, want PrefillSeconds %.9f", i, q.prompt, r.ttft(), wantTTFT)
		}
		if d := r.e2e() - wantE2E; d > 1e-6 || d < -1e-6 {
			t.Errorf("request %d: E2E %.9f, want %.9f", i, r.e2e(), wantE2E)
		}
		if d := r.queueing(); d > 1e-9 || d < -1e-9 {
			t.Errorf("request %d: queueing delay %.9f on an idle pod, want 0", i, d)
		}
	}
}

// The same seed gives the same numbers, for every policy: the bench's own randomness
// (prompt text) and every random choice of the picker (picker.Deps.Rand) come from the seed.
func TestDeterministicForASeed(t *testing.T) {
	w := tinyWorkload(t, "mix", 150)
	for _, pol := range allPolicies {
		t.Run(pol.name, func(t *testing.T) {
			c, _ := parseCluster("2x1p1d+1s")
			o := runOpts{params: sim.Llama8BH100(), scrape: 1, seed: 7, rate: 20}
			a, err := simulate(w, c, pol, o)
			if _, ok := err.(errNotRegistered); ok {
				t.Fatalf("policy not registered: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := simulate(w, c, pol, o)
			if err != nil {
				t.Fatal(err)
			}
			for i := range a.recs {
				if a.recs[i] != b.recs[i] {
					t.Fatalf("request %d differs between two runs with one seed: %+v vs %+v", i, a.recs[i], b.recs[i])
				}
			}
			sa, _ := summarize(a)
			sb, _ := summarize(b)
			if fmt.Sprint(sa) != fmt.Sprint(sb) {
				t.Fatalf("summaries differ: %+v vs %+v", sa, sb)
			}
		})
	}
	// Prompt text, and so the prefix sharing, depends on the seed only.
	dir, _ := findData("")
	w2, err := loadWorkload(dir, "mix", 150, sim.Llama8BH100(), 7)
	if err != nil {
		t.Fatal(err)
	}
	for i := range w2.reqs {
		if string(w2.reqs[i].body) != string(w.reqs[i].body) {
			t.Fatalf("request %d body differs for one seed", i)
		}
	}
}

// Mooncake requests that share leading hash ids share a real text prefix, so the engine
// sees whole shared blocks; Azure requests share nothing.
func TestPrefixSharingFollowsTheTrace(t *testing.T) {
	w := tinyWorkload(t, "mooncake", 200)
	shared := 0
	for i := 1; i < len(w.reqs); i++ {
		for j := 0; j < i; j++ {
			a, b := w.reqs[i].ids, w.reqs[j].ids
			if len(a) > 1 && len(b) > 1 && a[0] == b[0] {
				// one 512-token trace block = 32 engine blocks of 16 tokens
				n := min(len(w.reqs[i].hashes), len(w.reqs[j].hashes), 32)
				if !slices.Equal(w.reqs[i].hashes[:n], w.reqs[j].hashes[:n]) {
					t.Fatalf("requests %d and %d share hash id %d but not their first %d engine blocks", j, i, a[0], n)
				}
				shared++
				break
			}
		}
	}
	if shared == 0 {
		t.Fatal("no request in the first 200 shares a first block: the check checked nothing")
	}
	az := tinyWorkload(t, "conv", 20)
	if slices.Equal(az.reqs[0].hashes[:1], az.reqs[1].hashes[:1]) {
		t.Fatal("two Azure prompts share a first block")
	}
}

// The virtual engine's prefill–decode interference, worked by hand. Model: 0.0001 s per
// token computed, a 1000-token budget per iteration, a memory floor of 0.01 s per iteration,
// nothing else. A (100 prompt tokens, 4 out) arrives at 0 on an idle combined pod: its
// prefill iteration [0, 0.01] gives the first token, its first decode [0.01, 0.02] the second.
// B (2500 prompt tokens, 1 out) arrives at 0.015 and joins at 0.02: two iterations carry A's
// decode token and 999 of B's tokens (0.1 s each): A's tokens 3 and 4 at 0.12 and 0.22 (0.03
// and 0.04 alone); then B's last 502 tokens alone (0.0502 s): B's first token at 0.2702, a
// TTFT of 0.2552 (0.25 alone) and a prefill of 0.2502 from its scheduling.
func TestPrefillStallsDecodeOnCombinedPod(t *testing.T) {
	p := sim.Params{PrefillPerToken: 0.0001, DecodeBase: 0.01, MaxRunning: 64, MaxBatchedTokens: 1000,
		KVTokens: 100000, BlockSize: 16, DefaultMaxTokens: 16}
	c, _ := parseCluster("1x1p1d+1s")
	var std *vpod
	d := newDES()
	for _, e := range c.endpoints(false) {
		if strings.HasPrefix(e.Name, "standard-") {
			std = newPod(d, e, p)
		}
	}
	a := &wreq{id: 1, prompt: 100, out: 4}
	b := &wreq{id: 2, at: 0.015, prompt: 2500, out: 1}
	var ra, rb record
	fin := 0
	d.at(0, func() { ra.arrive = 0; runPlain(d, a, &ra, std, nil, func() { fin++ }) })
	d.at(0.015, func() { rb.arrive = 0.015; runPlain(d, b, &rb, std, nil, func() { fin++ }) })
	d.run()
	if fin != 2 {
		t.Fatalf("%d of 2 requests finished", fin)
	}
	near := func(got, want float64) bool { return got-want < 1e-9 && want-got < 1e-9 }
	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"A first token", ra.first, 0.01},
		{"A done", ra.done, 0.22},
		{"B TTFT", rb.ttft(), 0.2552},
		{"B prefill from its scheduling", rb.prefillC, 0.2502},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s = %.9f, want %.9f", c.what, c.got, c.want)
		}
	}
	if std.b.Mixed != 2 {
		t.Errorf("%d iterations mixed prefill and decode work, want 2", std.b.Mixed)
	}
	// What a scrape sees while a second prompt waits behind a prefill: vLLM's waiting count.
	d2 := newDES()
	v := newPod(d2, std.ep, p)
	var seen [2]float64
	d2.at(0, func() {
		v.add(&sim.Seq{Prompt: 5000, Out: 1}, func(sim.Event) {})
		v.add(&sim.Seq{Prompt: 5000, Out: 1}, func(sim.Event) {})
	})
	d2.at(0.05, func() { s := v.sample(); seen = [2]float64{s.Running, s.Waiting} })
	d2.run()
	if seen != [2]float64{1, 1} {
		t.Fatalf("running, waiting = %v, want [1 1]: the second prompt waits for the token budget", seen)
	}
}

// Steady load: arrivals are a Poisson process at the asked rate, the same for a seed and
// different across seeds; the measurement window leaves out the first and last 10 %.
func TestPoissonArrivalsAndWindow(t *testing.T) {
	w := tinyWorkload(t, "mix", 2000)
	a, b, c := w.arrivals(50, 1), w.arrivals(50, 1), w.arrivals(50, 2)
	if !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Fatal("arrivals must be a function of the seed")
	}
	if rate := float64(len(a)-1) / a[len(a)-1]; rate < 45 || rate > 55 {
		t.Fatalf("mean rate %.1f req/s, want about 50", rate)
	}
	if lo, hi := measureWindow(2000); lo != 200 || hi != 1800 {
		t.Fatalf("window [%d, %d), want [200, 1800)", lo, hi)
	}
	// Shuffled Azure windows carry their prefill work evenly: the last fifth about a fifth.
	total, last := 0, 0
	for i, q := range w.reqs {
		total += q.prompt
		if i >= len(w.reqs)*4/5 {
			last += q.prompt
		}
	}
	if share := float64(last) / float64(total); share > 0.3 {
		t.Fatalf("the last fifth of the mix window carries %.0f%% of the prompt tokens: not steady", share*100)
	}
	// Different repetitions replay different windows.
	dir, _ := findData("")
	tr, err := readTrace(dir, "mix")
	if err != nil {
		t.Fatal(err)
	}
	w0, _ := tr.window(100, 0, sim.Llama8BH100(), 7, defaultSLO)
	w1, _ := tr.window(100, 1, sim.Llama8BH100(), 7, defaultSLO)
	if string(w0.reqs[0].body) == string(w1.reqs[0].body) {
		t.Fatal("windows 0 and 1 start with the same request")
	}
}

// The whole run, twice with one seed, prints the same RESULT lines; the model's own lines
// and the headline lines are there.
func TestRunIsDeterministic(t *testing.T) {
	if _, err := findData(""); err != nil {
		t.Skipf("traces not available: %v", err)
	}
	var outs [2]string
	for i := range outs {
		o, err := parseFlags([]string{"-workloads", "code", "-clusters", "2x1p1d+1s", "-requests", "120", "-reps", "2",
			"-policies", "least_request,token_load,round-robin", "-validate=false", "-out", t.TempDir(),
			"-scenarios", "none,stalls", "-seeds", "2"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		var sb strings.Builder
		if err := run(o, &sb); err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(sb.String(), "\n") {
			if strings.HasPrefix(l, "RESULT ") {
				outs[i] += l + "\n"
			}
		}
	}
	if outs[0] != outs[1] {
		t.Fatalf("two runs with one seed differ:\n%s\nvs\n%s", outs[0], outs[1])
	}
	for _, want := range []string{"RESULT model_prefill_s_8192=", "RESULT model_prefill_s_131072=", "RESULT model_tpot_ms_batch32_ctx8192=",
		"RESULT ttft_p99_gain_vs_least_request_code=", "RESULT goodput_ratio_best_vs_least_request_code=",
		"RESULT worst_capacity_ratio_vs_best_baseline_token_load=", "RESULT best_baseline_code_2x1p1d+1s_tpot50=",
		"RESULT capacity_ratio_vs_best_baseline_code_2x1p1d+1s_stalls_tpot20_token_load=",
		"RESULT capacity_ratio_vs_best_baseline_code_2x1p1d+1s_none_tpot50_least-request-nopd="} {
		if !strings.Contains(outs[0], want) {
			t.Errorf("no %q line in:\n%s", want, outs[0])
		}
	}
}

// The report names the command that produced it, without this machine's paths.
func TestReportArgsDropPaths(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"-clusters 2x3p1d+2s -docs docs/quality", "-clusters 2x3p1d+2s -docs docs/quality"},
		{"-out /tmp/x -clusters 1x8p8d", "-clusters 1x8p8d"},
		{"--data=/somewhere/data -loads 0.8 -out=/tmp/y", "-loads 0.8"},
	} {
		if got := reportArgs(strings.Fields(c.in)); got != c.want {
			t.Errorf("reportArgs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	for _, c := range [][]string{{"-validate-scale", "0"}, {"-profile", "gpt-9"}, {"-slo-tpot", "0s"}} {
		if _, err := parseFlags(c, io.Discard); err == nil || !strings.Contains(err.Error(), c[0]) {
			t.Errorf("%v: error %v, want one naming %s", c, err, c[0])
		}
	}
	// -full widens loads and shapes unless they are given.
	o, err := parseFlags([]string{"-full", "-loads", "0.9"}, io.Discard)
	if err != nil || len(o.loads) != 1 || len(o.clusters) != 3 {
		t.Errorf("-full -loads 0.9: loads %v, %d clusters, err %v; want [0.9] and 3", o.loads, len(o.clusters), err)
	}
}

// An engine scenario changes iteration costs only: every request still completes, the
// realised cost ratio is near 1, and stalled iterations are recorded with their pod and times;
// the none scenario is the calibrated engine itself.
func TestScenarioRunsRecordStalls(t *testing.T) {
	w := tinyWorkload(t, "mix", 200)
	c, err := parseCluster("2x1p1d+1s")
	if err != nil {
		t.Fatal(err)
	}
	pol := byName(t, "least_request")
	plain, err := simulate(w, c, pol, runOpts{params: sim.Llama8BH100(), scrape: 1, seed: 3, rate: 2})
	if err != nil {
		t.Fatal(err)
	}
	none, err := simulate(w, c, pol, runOpts{params: sim.Llama8BH100(), scrape: 1, seed: 3, rate: 2, scenario: sim.ScenarioNone})
	if err != nil {
		t.Fatal(err)
	}
	for i := range plain.recs {
		if plain.recs[i].done != none.recs[i].done {
			t.Fatalf("request %d: done at %v without a scenario, %v under none", i, plain.recs[i].done, none.recs[i].done)
		}
	}
	st, err := simulate(w, c, pol, runOpts{params: sim.Llama8BH100(), scrape: 1, seed: 3, rate: 2, scenario: sim.ScenarioStalls, scenarioSeed: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.stalls) == 0 {
		t.Fatal("no stall recorded under the stalls scenario")
	}
	for _, s := range st.stalls {
		if s.pod == "" || !(s.to > s.from) {
			t.Errorf("stall event %+v: want a pod and a positive length", s)
		}
	}
	if r := st.costRatio(); r < 0.5 || r > 2 {
		t.Errorf("realised cost ratio %v", r)
	}
	routed, unseen, secs := st.stallRouted()
	if secs <= 0 || routed < 0 || unseen < 0 || unseen > routed {
		t.Errorf("stallRouted = %d, %d, %v", routed, unseen, secs)
	}
	t.Logf("%d stalls, cost ratio %.3f, %d requests routed into %.2f stalled pod-seconds", len(st.stalls), st.costRatio(), routed, secs)
}

// -check stalls prints a line per run and policy and the totals; its routed-per-second total
// is the runs' stallRouted summed, and pd-predictive is compared with least-request-nopd cell
// by cell. -check refuses an unknown measurement and a negative reference rate.
func TestCheckStalls(t *testing.T) {
	if _, err := findData(""); err != nil {
		t.Skipf("traces not available: %v", err)
	}
	o, err := parseFlags([]string{"-check", "stalls", "-workloads", "mix", "-clusters", "2x1p1d+1s", "-requests", "200",
		"-policies", "pd-predictive,least-request-nopd", "-scenarios", "stalls", "-seeds", "2", "-loads", "1.0",
		"-check-rate", "40", "-validate=false"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	if err := run(o, &sb); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	if n := strings.Count(out, "\nload 1.00 seed "); n != 4 {
		t.Errorf("%d run lines, want 4 (2 seeds × 2 policies):\n%s", n, out)
	}
	// Recount pd-predictive's total from the runs themselves.
	dir, _ := findData("")
	tr, err := readTrace(dir, "mix")
	if err != nil {
		t.Fatal(err)
	}
	w, err := tr.window(200, 0, o.params, o.seed, o.slo)
	if err != nil {
		t.Fatal(err)
	}
	pol := allPolicies[slices.IndexFunc(allPolicies, func(p policy) bool { return p.name == "pd-predictive" })]
	hits, unseen, secs := 0, 0, 0.0
	for seed := uint64(1); seed <= 2; seed++ {
		res, err := simulate(w, o.clusters[0], pol, runOpts{params: o.params, scrape: o.scrape, seed: seed, rate: 40, scenario: "stalls", scenarioSeed: seed})
		if err != nil {
			t.Fatal(err)
		}
		n, u, s := res.stallRouted()
		hits, unseen, secs = hits+n, unseen+u, secs+s
	}
	want := fmt.Sprintf("RESULT check_stall_routed_per_stall_second_pd-predictive=%.3f\n", float64(hits)/max(secs, 1e-9))
	wantUnseen := fmt.Sprintf("RESULT check_stall_routed_before_evidence_per_stall_second_pd-predictive=%.3f\n", float64(unseen)/max(secs, 1e-9))
	if !strings.Contains(out, want) || !strings.Contains(out, wantUnseen) || !strings.Contains(out, "RESULT check_p99_ttft_worse_than_least-request-nopd_cells_pd-predictive=") {
		t.Errorf("want %q, %q and the p99 comparison in:\n%s", want, wantUnseen, out)
	}
	for _, c := range [][]string{{"-check", "stall"}, {"-check-rate", "-1"}} {
		if _, err := parseFlags(c, io.Discard); err == nil || !strings.Contains(err.Error(), c[0]) {
			t.Errorf("%v: error %v, want one naming %s", c, err, c[0])
		}
	}
}

// A zoned shape alternates each side's pods over its zones, each pod on its own node, and
// a KV transfer between zones takes crossZoneSlowdown times as long as within one.
func TestZonedShape(t *testing.T) {
	c, err := parseCluster("1x2p2d@2z")
	if err != nil || c.zones != 2 {
		t.Fatalf("parseCluster: %+v, %v: want 2 zones", c, err)
	}
	zones := map[string]string{}
	for _, e := range c.endpoints(false) {
		zones[e.Name] = e.Labels["topology.kubernetes.io/zone"]
		if e.Labels["kubernetes.io/hostname"] != "node-"+e.Name {
			t.Errorf("%s: labels %v: want its own node", e.Name, e.Labels)
		}
	}
	want := map[string]string{"rs0-prefill-0": "zone-a", "rs0-prefill-1": "zone-b", "rs0-decode-0": "zone-a", "rs0-decode-1": "zone-b"}
	if fmt.Sprint(zones) != fmt.Sprint(want) {
		t.Errorf("zones %v, want %v", zones, want)
	}
	d := newDES()
	p := sim.Llama8BH100()
	eps := c.endpoints(false)
	pods := map[string]*vpod{}
	for _, e := range eps {
		pods[e.Name] = newPod(d, e, p)
	}
	in, across := transferSeconds(p, pods["rs0-prefill-0"], pods["rs0-decode-0"], 4000), transferSeconds(p, pods["rs0-prefill-0"], pods["rs0-decode-1"], 4000)
	if in != sim.TransferSeconds(p, 4000) || across != crossZoneSlowdown*in {
		t.Errorf("transfer of 4000 tokens: %.4f s in a zone, %.4f s across: want %.4f and %d× that", in, across, sim.TransferSeconds(p, 4000), crossZoneSlowdown)
	}
}

// -check topology runs both policies per seed and load on every zoned shape, prints a RESULT
// line per shape, fails unless topology-aware pairing lowers p99 TTFT with no failed request,
// and refuses a shape without zones. The shape is make bench-topology's first, at one load and
// two seeds (it measured 326 against 882 ms).
func TestCheckTopology(t *testing.T) {
	if _, err := findData(""); err != nil {
		t.Skipf("traces not available: %v", err)
	}
	o, err := parseFlags([]string{"-check", "topology", "-workloads", "mix", "-clusters", "1x4p4d@2z",
		"-seeds", "2", "-loads", "1.0", "-validate=false", "-capacity=false"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	err = run(o, &sb)
	out := sb.String()
	t.Log(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if n := strings.Count(out, "\nload 1.00 seed "); n != 4 {
		t.Errorf("%d run lines, want 4 (aware and blind, two seeds):\n%s", n, out)
	}
	if !strings.Contains(out, "RESULT topology shape=1x4p4d@2z workload=mix p99_ttft_aware_ms=") || !strings.Contains(out, "failures_aware=0 failures_blind=0\n") {
		t.Errorf("want a RESULT line for the shape with no failures in:\n%s", out)
	}
	o, _ = parseFlags([]string{"-check", "topology", "-workloads", "mix", "-clusters", "1x2p2d", "-validate=false", "-capacity=false"}, io.Discard)
	if err := run(o, io.Discard); err == nil || !strings.Contains(err.Error(), "has no zones") {
		t.Errorf("a shape without zones: error %v, want one saying so", err)
	}
}

// stallRouted counts a request once whether its prefill or its decode pod stalled when it
// arrived, and as before any evidence while the stalled iteration had not yet lasted its
// calibrated length (its length over sim.StallFactor).
func TestStallRoutedBeforeEvidence(t *testing.T) {
	iter := 0.01
	r := &runResult{
		stalls: []stallEvent{{pod: "d", from: 1, to: 1 + iter*sim.StallFactor}, {pod: "p", from: 1.004, to: 1.004 + iter*sim.StallFactor}},
		recs: []record{
			{arrive: 0.5, prefillPod: "p", decodePod: "d"},                      // before: no stall
			{arrive: 1 + iter/2, prefillPod: "p", decodePod: "d"},               // both stalled: once, unseen in both
			{arrive: 1.012, prefillPod: "p", decodePod: "d"},                    // both: seen in d (not yet in p)
			{arrive: 1 + 2*iter, prefillPod: "x", decodePod: "d"},               // decode pod, seen
			{arrive: 1 + 2*iter, prefillPod: "d", decodePod: "d", failed: "x"},  // failed: not counted
			{arrive: 1 + iter*sim.StallFactor, prefillPod: "d", decodePod: "d"}, // the stall has ended
		},
	}
	routed, unseen, secs := r.stallRouted()
	if routed != 3 || unseen != 1 {
		t.Errorf("routed %d, unseen %d; want 3, 1", routed, unseen)
	}
	// The stalls are clipped to the arrivals' span [0.5, 1.2]: 0.2 s and 0.196 s.
	if d := secs - 0.396; d > 1e-9 || d < -1e-9 {
		t.Errorf("stalled seconds %v, want 0.396", secs)
	}
}
