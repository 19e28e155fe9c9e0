package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/tokenize"
	"github.com/tandem-epp/tandem/traces"
)

// simBinary is $TANDEM_LLMD_SIM or llm-d-inference-sim from PATH; the test fails (it does not
// skip) without one: hack/test.sh builds and exports it.
func simBinary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("TANDEM_LLMD_SIM"); b != "" {
		return b
	}
	b, err := exec.LookPath("llm-d-inference-sim")
	if err != nil {
		t.Fatal("llm-d-inference-sim not found: run hack/ensure-llmd-sim.sh (builds llm-d's simulator from the Go module proxy) and set TANDEM_LLMD_SIM to what it prints")
	}
	return b
}

// TestLiveCoreOnRealSimulators runs bench-live's core on a tiny schedule: real llm-d
// simulators, Tandem's cmd/epp and cmd/gateway as processes, every router, and checks the
// report's numbers against what the simulators were configured to do.
func TestLiveCoreOnRealSimulators(t *testing.T) {
	cells, out, o := runTiny(t, "-llmd-epp", "", "-llmd-sidecar", "")
	if len(cells) != len(allRouters) {
		t.Fatalf("%d cells, want one per router (%d)", len(cells), len(allRouters))
	}
	e := o.engine
	for _, c := range cells {
		s := c.s
		if s.n != 16 || s.success() != 1 {
			t.Errorf("%s: %d measured, success %.3f (errors %v); want 16 (20 less a tenth at each end), all successful", c.router, s.n, s.success(), s.errs)
		}
		// TTFT at least the KV transfer or prefill of a short prompt, at most a few seconds
		if !(s.ttft50 > 0.002 && s.ttft99 < 5 && s.ttft50 <= s.ttft99) {
			t.Errorf("%s: TTFT p50 %.4fs p99 %.4fs: not sane", c.router, s.ttft50, s.ttft99)
		}
		// No stream is faster than the engine generates (the simulator keeps each token
		// within ±70 % of the inter-token latency), and TPOT p99 stays under four times its
		// full-batch value.
		if hi := 4 * e.timeFactor * e.itl.Seconds(); !(s.tpot50 > 0 && s.tpot99 <= hi) {
			t.Errorf("%s: TPOT p50 %.4fs p99 %.4fs: want positive and at most %.4fs", c.router, s.tpot50, s.tpot99, hi)
		}
		for _, run := range c.runs {
			for i, r := range run.res {
				if floor := 0.3 * float64(run.reqs[i].out-1) * e.itl.Seconds(); r.ok && r.e2e < floor {
					t.Errorf("%s: request %d streamed %d tokens in %.4fs, under the engine's %.4fs", c.router, i, r.tokens, r.e2e, floor)
				}
			}
		}
		for k, g := range s.good {
			if g < 0 || g > 1 || math.IsNaN(g) {
				t.Errorf("%s: goodput[%d] %v", c.router, k, g)
			}
		}
		if got := s.placed["decode"] + s.placed["standard"]; got != 20 {
			t.Errorf("%s: decode and standard pods finished %.0f requests; want the 20 sent", c.router, got)
		}
	}
	byName := map[string]stats{}
	for _, c := range cells {
		byName[c.router] = c.s
	}
	// Where the work ran: pd disaggregates every request (its prefill legs on the prefill
	// pod, nothing on the standard pod); the whole-request routers never touch the prefill pod.
	if p := byName["pd"].placed; p["prefill"] != 20 || p["standard"] != 0 {
		t.Errorf("pd: served %v; want 20 prefill legs and nothing on the standard pod", p)
	}
	for _, r := range []string{"least-request-nopd", "round-robin"} {
		if p := byName[r].placed; p["prefill"] != 0 || p["standard"] == 0 {
			t.Errorf("%s: served %v; want nothing on the prefill pod and some on the standard pod", r, p)
		}
	}
	for _, want := range []string{"RESULT live_load_average_start=", "RESULT live_ttft_p99_ms_pd-predictive_0.5=",
		"RESULT live_goodput_tpot20_round-robin_0.5=", "RESULT live_ttft_p99_ratio_vs_best_baseline_0.5="} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if regexp.MustCompile(`RESULT \S+=nan`).MatchString(out.String()) {
		t.Errorf("a RESULT is nan:\n%s", out.String())
	}
}

// runTiny runs bench-live's core on 20 requests at load 0.5 over one roleset and one standard
// pod, with args added to the flags, and returns its cells, report and options.
func runTiny(t *testing.T, args ...string) ([]cell, *bytes.Buffer, *options) {
	t.Helper()
	sim := simBinary(t)
	root, err := demo.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bins, err := buildTandem(ctx, root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bins.sim = sim
	o, err := parseFlags(append([]string{"-sim", sim, "-requests", "20", "-loads", "0.5", "-pods", "1x1p1d+1s",
		"-inter-token-latency", "4ms", "-time-factor-under-load", "2", "-max-output", "24"}, args...), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	bins.llmdEPP, bins.sidecar = o.llmdEPP, o.sidecar
	var out, progress bytes.Buffer
	cells, err := run(ctx, o, bins, &out, &progress)
	t.Log(progress.String())
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	return cells, &out, o
}

// TestLLMDEPPOnRealSimulators runs llm-d's own EPP (cmd/epp with its P/D configuration) and
// routing sidecar beside pd-predictive on real simulators, each pod in a network namespace of
// its own and the pods found through a real kube-apiserver, and checks llm-d served every
// request and disaggregated as its configuration says. hack/test.sh builds llm-d
// (hack/ensure-llmd-epp.sh) and exports TANDEM_LLMD_EPP and TANDEM_LLMD_SIDECAR where this
// process may make network namespaces; elsewhere the test is skipped, saying why.
func TestLLMDEPPOnRealSimulators(t *testing.T) {
	epp, sidecar := os.Getenv("TANDEM_LLMD_EPP"), os.Getenv("TANDEM_LLMD_SIDECAR")
	if epp == "" || sidecar == "" {
		t.Skip("TANDEM_LLMD_EPP or TANDEM_LLMD_SIDECAR unset: hack/test.sh sets them from hack/ensure-llmd-epp.sh (TANDEM_LLMD_EPP only where network namespaces can be made)")
	}
	needNetAdmin(t)
	cells, out, _ := runTiny(t, "-routers", "pd-predictive,llm-d", "-llmd-epp", epp, "-llmd-sidecar", sidecar)
	if len(cells) != 2 || cells[1].router != llmdRouter.name {
		t.Fatalf("cells %d (last %q), want pd-predictive and llm-d", len(cells), cells[len(cells)-1].router)
	}
	s := cells[1].s
	if s.n != 16 || s.success() != 1 {
		t.Errorf("llm-d: %d measured, success %.3f (errors %v); want 16, all successful", s.n, s.success(), s.errs)
	}
	// Every prompt has far more than the decider's 16 uncached tokens, so llm-d runs each
	// prefill on the prefill pod and finishes it through the sidecar on a pod its decode filter
	// keeps: the decode pod or the standard pod (no role label, which that filter lets through).
	if p := s.placed; p["prefill"] != 20 || p["decode"]+p["standard"] != 20 {
		t.Errorf("llm-d: served %v; want 20 prefill legs and 20 decodes", p)
	}
	for _, want := range []string{"RESULT live_ttft_p99_ms_llm-d_0.5=", "RESULT live_ttft_p99_ratio_vs_llmd_0.5="} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// TestPromptTokensAgree checks that the prompt text has the trace's token count for the
// simulator's dummy tokenizer (a word each) and for cl100k_base, which Tandem counts with.
func TestPromptTokensAgree(t *testing.T) {
	for _, n := range []int{1, 17, 900} {
		text := promptText(n, 3, uint64(n))
		if got := len(strings.Fields(text)); got != n {
			t.Errorf("%d tokens: %d words", n, got)
		}
		got, _, err := tokenize.Count(text, 0)
		if err != nil || got != n {
			t.Errorf("%d tokens: cl100k_base counts %d (%v)", n, got, err)
		}
	}
}

// TestScheduleIsTheSameForEveryRouter: the same seed gives the same requests at the same
// instants, at the asked mean rate.
func TestScheduleIsTheSameForEveryRouter(t *testing.T) {
	rows, err := readWorkload(traces.Embedded(), "mix")
	if err != nil {
		t.Fatal(err)
	}
	reqs, _, err := requestsOf(rows, 400, defaultEngine.maxModelLen, 1, defaultEngine, defaultSLO, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := schedule(reqs, 5, 1, 1), schedule(reqs, 5, 1, 1)
	for i := range a {
		if a[i].at != b[i].at || !bytes.Equal(a[i].body, b[i].body) {
			t.Fatalf("request %d differs between two schedules of one seed", i)
		}
	}
	if rate := float64(len(a)-1) / a[len(a)-1].at; rate < 4 || rate > 6 {
		t.Errorf("mean rate %.2f req/s; want about 5", rate)
	}
	if c := schedule(reqs, 5, 2, 1); c[10].at == a[10].at {
		t.Error("another seed gave the same arrivals")
	}
	// another text seed: the same lengths and instants, no prompt in common
	c := schedule(reqs, 5, 1, 2)
	for i := range a {
		if c[i].at != a[i].at || c[i].prompt != a[i].prompt || bytes.Equal(c[i].body, a[i].body) {
			t.Fatalf("request %d: a text seed changed its instant or length, or kept its text", i)
		}
	}
}

// TestCapacitySearchFindsTheKnee: on a toy router whose goodput falls below the target past a
// known load, the search brackets that load from the grid and narrows it by bisection.
func TestCapacitySearchFindsTheKnee(t *testing.T) {
	for _, knee := range []float64{0.35, 0.83, 1.6, 2.7} {
		probes := 0
		toy := func(l float64) (float64, error) {
			probes++
			if l <= knee {
				return 0.95, nil
			}
			return 0.5, nil
		}
		var grid []float64
		for _, l := range []float64{0.7, 1.0} {
			g, _ := toy(l)
			grid = append(grid, l, g)
		}
		probes = 0
		c, err := searchCapacity(grid, 8, toy)
		if err != nil {
			t.Fatal(err)
		}
		if !(c.load <= knee && knee < c.above) || math.IsInf(c.above, 1) {
			t.Errorf("knee %.2f: bracket [%.3f, %.3f) misses it or has no failing load", knee, c.load, c.above)
		}
		if knee < 2 && c.above-c.load > capTolerance*c.above {
			t.Errorf("knee %.2f: bracket [%.3f, %.3f) wider than %.0f %% after 8 steps", knee, c.load, c.above, capTolerance*100)
		}
		if c.probes != probes || probes > 8 {
			t.Errorf("knee %.2f: %d probes made, %d counted; want the same, at most 8", knee, probes, c.probes)
		}
	}
	// A search stops once the bracket is within the tolerance, however many steps are left.
	c, _ := searchCapacity([]float64{0.99, 0.95, 1.0, 0.5}, 8, func(float64) (float64, error) {
		t.Error("probed a bracket already within 2 %")
		return 0, nil
	})
	if c.load != 0.99 || c.above != 1.0 || c.probes != 0 {
		t.Errorf("bracket [%.3f, %.3f) after %d probes; want [0.99, 1) after none", c.load, c.above, c.probes)
	}
}
