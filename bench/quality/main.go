// Command quality is the routing-quality benchmark (make bench-quality): it replays real
// traces (Azure LLM 2023 conv and code, their mix, Mooncake) through the real Tandem picker
// in virtual time, over simulated engine pods that run internal/sim's engine model and
// scheduling core (a calibrated profile, llama8b-h100 by default), at steady Poisson load over
// several windows of each trace, and compares routing policies on the latency users feel:
// TTFT, queueing delay, slowdown, TPOT, end-to-end, SLO goodput per request.
//
// It owns the discrete-event simulation, the workloads, the report (markdown, PNG, RESULT
// lines) and the check of the virtual-time engine against the real-time simulator. It must
// not tune anything per policy: every policy sees the same pods, requests and parameters.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tandem-epp/tandem/internal/demo/launch"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/sim"
)

// SLO bounds for goodput, per request. TTFT: 1 s, or three times the request's own prefill
// time on an idle pod when that is longer (a 100k-token prompt cannot prefill in 1 s on any
// pod). TPOT: 50 ms (20 tokens/s, faster than reading), which a decode pod meets at hundreds
// of sequences and a combined pod misses when its decodes share iterations with long chunks.
type sloSpec struct {
	ttft, ttftPrefill, tpot float64 // seconds, a multiple, seconds
}

var defaultSLO = sloSpec{ttft: 1.0, ttftPrefill: 3.0, tpot: 0.050}

// of is one request's SLO bounds: TTFT, TPOT.
func (s sloSpec) of(p sim.Params, prompt int) (float64, float64) {
	return max(s.ttft, s.ttftPrefill*sim.PrefillSeconds(p, prompt)), s.tpot
}

type options struct {
	seed      uint64
	workloads []string
	loads     []float64
	clusters  []clusterSpec
	policies  []policy
	requests  map[string]int
	outDir    string
	docsDir   string
	dataDir   string
	scrape    float64
	workers   int
	validate  bool
	args      string // the command-line flags, for the report
	valScale  float64
	reps      int
	profile   string
	params    sim.Params
	full      bool
	slo       sloSpec
	// -check: a focused measurement instead of the report (checkStalls, checkGrid), and the
	// rate -loads are fractions of there (0: the seed default's capacity, as the sweep's)
	check     string
	checkRate float64
	// the capacity section: engine scenarios, seeds per scenario, TPOT objectives, policies
	capacity    bool
	scenarios   []string
	seeds       int
	capTPOTs    []float64
	capPolicies []policy
}

// defaultRequests per repetition: with 4 repetitions and the first and last 10 % of each left
// out, every cell's p99 rests on at least 22 requests.
var defaultRequests = map[string]int{"conv": 1500, "code": 1500, "mix": 2000, "mooncake": 700}

// The default matrix and the full one (-full).
const (
	defaultLoads    = "0.8,1.0"
	fullLoads       = "0.5,0.8,1.0,1.2"
	defaultClusters = "4x1p1d+2s,1x8p8d"
	fullClusters    = "4x1p1d+2s,1x8p8d,2x3p1d+2s"
)

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-quality:", err)
		os.Exit(2)
	}
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-quality:", err)
		os.Exit(1)
	}
}

// reportArgs is the command line for the report, without -out and -data, whose values are
// paths on this machine.
func reportArgs(args []string) string {
	var keep []string
	for i := 0; i < len(args); i++ {
		name := strings.TrimLeft(args[i], "-")
		if k, _, ok := strings.Cut(name, "="); ok {
			if k == "out" || k == "data" {
				continue
			}
		} else if name == "out" || name == "data" {
			i++ // and its value
			continue
		}
		keep = append(keep, args[i])
	}
	return strings.Join(keep, " ")
}

func parseFlags(args []string, errOut io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench-quality", flag.ContinueOnError)
	fs.SetOutput(errOut)
	seed := fs.Uint64("seed", 1, "seed for prompt text (the only randomness the bench owns)")
	wl := fs.String("workloads", "conv,code,mix,mooncake", "workloads: conv, code, mix, mooncake")
	loads := fs.String("loads", defaultLoads, "offered loads as fractions of the measured capacity (-full: "+fullLoads+")")
	clusters := fs.String("clusters", defaultClusters, "cluster shapes <rolesets>x<prefill>p<decode>d[+<standard>s], comma-separated (-full: "+fullClusters+")")
	full := fs.Bool("full", false, "the full matrix: loads "+fullLoads+" and shapes "+fullClusters+" (unless -loads / -clusters say otherwise)")
	profile := fs.String("profile", "llama8b-h100", "engine model of every pod: "+profileNames())
	pols := fs.String("policies", "", "policies to compare (default all): "+policyNames())
	reqs := fs.Int("requests", 0, "requests per repetition and workload (0: conv 1500, code 1500, mix 2000, mooncake 700)")
	out := fs.String("out", "", "output directory (default bench/quality/out under the repository)")
	docs := fs.String("docs", "", "also copy the markdown table and PNGs here (e.g. docs/quality)")
	data := fs.String("data", "", "trace directory (default traces/ in the repository)")
	scrape := fs.Duration("scrape", time.Second, "metric scrape interval (the gateway default is 1s)")
	workers := fs.Int("workers", min(2, runtime.NumCPU()), "runs simulated in parallel")
	validate := fs.Bool("validate", true, "compare the virtual-time engine with the real-time simulator first")
	valScale := fs.Float64("validate-scale", valTimeScale, "time scale of the real-time simulator in the check (wall = model × scale)")
	sloTTFT := fs.Duration("slo-ttft", secondsDur(defaultSLO.ttft), "SLO: TTFT bound (the larger of this and -slo-ttft-prefill × the request's idle-pod prefill)")
	sloTTFTx := fs.Float64("slo-ttft-prefill", defaultSLO.ttftPrefill, "SLO: TTFT bound as a multiple of the request's own idle-pod prefill time")
	sloTPOT := fs.Duration("slo-tpot", secondsDur(defaultSLO.tpot), "SLO: TPOT bound (mean time per output token after the first)")
	capOn := fs.Bool("capacity", true, "search every policy's SLO-goodput capacity against the best baseline (the headline section)")
	scen := fs.String("scenarios", "none,jitter,stalls", "engine scenarios of the capacity section: "+strings.Join(sim.ScenarioNames, ", ")+
		"; none runs on every workload and shape, the others on mix at the first shape (-full: all scenarios everywhere)")
	seeds := fs.Int("seeds", 3, "seeds per engine scenario other than none (the worst is reported)")
	capTPOT := fs.String("capacity-tpots", "50ms,20ms", "TPOT objectives of the capacity section (RESULT names tpot<ms>)")
	capPols := fs.String("capacity-policies", "", "policies whose capacity is searched besides the baselines (default pd-predictive; -full or -policies: every policy run)")
	reps := fs.Int("reps", 4, "repetitions per cell: repetition k replays window k of the trace with Poisson arrivals and picker seed seed+k; requests are pooled")
	check := fs.String("check", "", "instead of the report, a focused measurement on the first workload and shape: "+
		"stalls — each policy's p99 TTFT and requests routed into a stalled pod per stalled pod-second, per -loads × seeds 1..-seeds, under the first of -scenarios; "+
		"grid — pd-predictive's mean share of requests meeting both objectives over a grid of rates around its capacity, per scenario, seed and TPOT objective; "+
		"topology — pd-predictive with and without topology-aware pairing on a zoned shape (e.g. 2x2p2d@2z), per -loads × seeds 1..-seeds: pooled p99 TTFT, cross-zone pairs, failures")
	checkRate := fs.Float64("check-rate", 0, "-check stalls: the rate (req/s) -loads are fractions of (0: the seed default's capacity, as the load sweep's)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *check != "" && *check != "stalls" && *check != "grid" && *check != "advisor" && *check != "topology" {
		return nil, fmt.Errorf("-check=%q: want stalls, grid, advisor or topology", *check)
	}
	if *checkRate < 0 {
		return nil, fmt.Errorf("-check-rate=%v: want a rate in req/s, or 0", *checkRate)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *full {
		if !set["loads"] {
			*loads = fullLoads
		}
		if !set["clusters"] {
			*clusters = fullClusters
		}
		if !set["scenarios"] {
			*scen = strings.Join(sim.ScenarioNames, ",")
		}
	}
	mk, ok := sim.Profiles[*profile]
	if !ok {
		return nil, fmt.Errorf("-profile: unknown profile %q; valid: %s", *profile, profileNames())
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o := &options{args: reportArgs(args), seed: *seed, outDir: *out, docsDir: *docs, dataDir: *data, scrape: scrape.Seconds(),
		workers: max(1, *workers), validate: *validate, valScale: *valScale, reps: *reps, profile: *profile, params: mk(), full: *full, requests: map[string]int{},
		slo: sloSpec{ttft: sloTTFT.Seconds(), ttftPrefill: *sloTTFTx, tpot: sloTPOT.Seconds()}}
	if o.slo.ttft <= 0 || o.slo.ttftPrefill < 0 || o.slo.tpot <= 0 {
		return nil, fmt.Errorf("-slo-ttft %v, -slo-ttft-prefill %v, -slo-tpot %v: want positive bounds (the multiple may be 0)", *sloTTFT, *sloTTFTx, *sloTPOT)
	}
	if o.reps < 1 || o.reps > 100 {
		return nil, fmt.Errorf("-reps=%d: want 1..100", o.reps)
	}
	if o.valScale <= 0 || o.valScale > 10 {
		return nil, fmt.Errorf("-validate-scale=%v: want a time scale in (0, 10], e.g. 0.5", o.valScale)
	}
	if o.scrape <= 0 {
		return nil, fmt.Errorf("-scrape=%v: must be positive", *scrape)
	}
	for _, w := range splitList(*wl) {
		if _, ok := defaultRequests[w]; !ok {
			return nil, fmt.Errorf("-workloads: unknown workload %q; valid: conv, code, mix, mooncake", w)
		}
		o.workloads = append(o.workloads, w)
		o.requests[w] = defaultRequests[w]
		if *reqs > 0 {
			o.requests[w] = *reqs
		}
	}
	for _, s := range splitList(*loads) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 || v > 10 {
			return nil, fmt.Errorf("-loads: %q: want fractions of capacity in (0, 10], e.g. 0.8", s)
		}
		o.loads = append(o.loads, v)
	}
	for _, s := range splitList(*clusters) {
		c, err := parseCluster(s)
		if err != nil {
			return nil, err
		}
		o.clusters = append(o.clusters, c)
	}
	if *pols == "" {
		o.policies = allPolicies
	} else {
		for _, n := range splitList(*pols) {
			i := slices.IndexFunc(allPolicies, func(p policy) bool { return p.name == n })
			if i < 0 {
				return nil, fmt.Errorf("-policies: unknown policy %q; valid: %s", n, policyNames())
			}
			o.policies = append(o.policies, allPolicies[i])
		}
	}
	o.capacity, o.seeds = *capOn, *seeds
	o.check, o.checkRate = *check, *checkRate
	if o.seeds < 1 || o.seeds > 100 {
		return nil, fmt.Errorf("-seeds=%d: want 1..100", o.seeds)
	}
	for _, n := range splitList(*scen) {
		if err := sim.CheckScenario(n); err != nil {
			return nil, fmt.Errorf("-scenarios: %w", err)
		}
		o.scenarios = append(o.scenarios, n)
	}
	for _, s := range splitList(*capTPOT) {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("-capacity-tpots: %q: want positive durations, e.g. 50ms,20ms", s)
		}
		o.capTPOTs = append(o.capTPOTs, d.Seconds())
	}
	if o.capacity && (len(o.scenarios) == 0 || len(o.capTPOTs) == 0) {
		return nil, fmt.Errorf("-scenarios and -capacity-tpots: need at least one each (or -capacity=false)")
	}
	var capNames []string
	switch {
	case *capPols != "":
		capNames = splitList(*capPols)
	case *full || *pols != "":
		for _, p := range o.policies {
			capNames = append(capNames, p.name)
		}
	default:
		capNames = []string{"pd-predictive"}
	}
	for _, n := range capNames {
		if !slices.ContainsFunc(allPolicies, func(p policy) bool { return p.name == n }) {
			return nil, fmt.Errorf("-capacity-policies: unknown policy %q; valid: %s", n, policyNames())
		}
	}
	for _, p := range allPolicies {
		if isBaseline(p.name) || slices.Contains(capNames, p.name) {
			o.capPolicies = append(o.capPolicies, p)
		}
	}
	if len(o.workloads) == 0 || len(o.loads) == 0 || len(o.clusters) == 0 || len(o.policies) == 0 {
		return nil, fmt.Errorf("need at least one workload, load, cluster and policy")
	}
	return o, nil
}

func profileNames() string {
	var ns []string
	for n := range sim.Profiles {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return strings.Join(ns, ", ")
}

func policyNames() string {
	var ns []string
	for _, p := range allPolicies {
		ns = append(ns, p.name)
	}
	return strings.Join(ns, ", ")
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func secondsDur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// capacityPolicy measures capacity: the seed's defaults, what Tandem ships.
const capacityPolicy = "seed-default"

// capacity is the highest steady (Poisson) arrival rate the cluster sustains under the
// capacity policy, found by search to within 4 %: a rate is sustained when the mean queueing
// delay (TTFT minus the request's idle-pod TTFT) of the last third of the measured arrivals
// is at most 1.25 × that of the first third + 0.25 s, i.e. queues do not grow over the run.
// Above capacity they grow without bound, so the first third and the last part ways.
func capacity(w *workload, c clusterSpec, o *options) (float64, error) {
	pol := allPolicies[slices.IndexFunc(allPolicies, func(p policy) bool { return p.name == capacityPolicy })]
	sustained := func(rate float64) (bool, error) {
		res, err := simulate(w, c, pol, runOpts{params: o.params, scrape: o.scrape, seed: o.seed, rate: rate})
		if err != nil {
			return false, err
		}
		var m []float64
		for _, r := range res.recs {
			if r.measured && r.failed == "" {
				m = append(m, r.queueing())
			}
		}
		third := len(m) / 3
		if third < 10 {
			return false, fmt.Errorf("capacity run of %s: only %d measured requests", w.name, len(m))
		}
		mean := func(xs []float64) float64 {
			t := 0.0
			for _, x := range xs {
				t += x
			}
			return t / float64(len(xs))
		}
		return mean(m[len(m)-third:]) <= 1.25*mean(m[:third])+0.25, nil
	}
	// Start from the prefill capacity of the pods the policy prefills on.
	meanPrefill := 0.0
	for _, q := range w.reqs {
		meanPrefill += sim.PrefillSeconds(o.params, q.prompt)
	}
	meanPrefill /= float64(len(w.reqs))
	lo, hi := 0.0, 0.0
	r := float64(c.rolesets*c.prefill) / meanPrefill
	for i := 0; i < 12 && (lo == 0 || hi == 0); i++ {
		ok, err := sustained(r)
		if err != nil {
			return 0, err
		}
		if ok {
			lo, r = r, r*2
		} else {
			hi, r = r, r/2
		}
		if lo > 0 && hi > 0 {
			break
		}
	}
	if lo == 0 || hi == 0 {
		return 0, fmt.Errorf("capacity of %s on %s: no sustained rate between %.3g and %.3g req/s", w.name, c.name, r/4096, r*4096)
	}
	for hi/lo > 1.04 {
		mid := (lo + hi) / 2
		ok, err := sustained(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// cell is one run's summary.
type cell struct {
	workload, cluster, policy string
	load                      float64
	rate                      float64 // offered requests/s
	s                         summary
	ttfts                     []float64 // sorted, for the CDF
	reps                      []summary // each repetition alone, for the spread
	note                      string
	skipped                   string
	bucketSteps               int
	pred                      []latency.ErrorSummary // the latency models' TTFT error, per repetition (predictive policies)
}

func run(o *options, stdout io.Writer) error {
	start := time.Now()
	if o.outDir == "" {
		root, err := repoRoot()
		if err != nil {
			return err
		}
		o.outDir = filepath.Join(root, "bench", "quality", "out")
	}
	if err := os.MkdirAll(o.outDir, 0o755); err != nil {
		return err
	}
	dataDir, err := findData(o.dataDir)
	if err != nil {
		return err
	}
	if o.check != "" {
		return runCheck(o, dataDir, stdout)
	}
	rep := &report{o: o, started: start, loadStart: loadAverage()}
	fmt.Fprintf(stdout, "machine load average at start: %s (%d CPUs)\n", rep.loadStart, runtime.NumCPU())
	capWins, guesses := map[string]*workload{}, map[string]float64{}
	if o.validate {
		vs, err := validateEngine(o)
		if err != nil {
			return fmt.Errorf("validation against internal/sim: %w", err)
		}
		rep.validation = vs
		for _, v := range vs {
			fmt.Fprint(stdout, v.text())
		}
	}
	for _, c := range o.clusters {
		for _, wn := range o.workloads {
			t0 := time.Now()
			tr, err := readTrace(dataDir, wn)
			if err != nil {
				return err
			}
			wins := make([]*workload, o.reps)
			for k := range wins {
				if wins[k], err = tr.window(o.requests[wn], k, o.params, o.seed, o.slo); err != nil {
					return err
				}
			}
			w := wins[0]
			cp, err := capacity(w, c, o)
			if err != nil {
				return err
			}
			capWins[c.name+"/"+wn], guesses[c.name+"/"+wn] = w, cp
			traceRate := float64(len(w.reqs)-1) / w.span
			rep.workloads = append(rep.workloads, wlInfo{w: w, cluster: c.name, capacity: cp, traceRate: traceRate})
			type job struct {
				load float64
				pol  policy
				idx  int
			}
			var jobs []job
			for _, l := range o.loads {
				for _, p := range o.policies {
					jobs = append(jobs, job{l, p, len(jobs)})
				}
			}
			cells := make([]cell, len(jobs))
			var wg sync.WaitGroup
			ch := make(chan job)
			var firstErr error
			var mu sync.Mutex
			for k := 0; k < o.workers; k++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range ch {
						rate := j.load * cp
						cl := cell{workload: wn, cluster: c.name, policy: j.pol.name, load: j.load, rate: rate}
						res, reps, err := simulateReps(wins, c, j.pol, runOpts{params: o.params, scrape: o.scrape, seed: o.seed, rate: rate})
						if err != nil {
							if _, ok := err.(errNotRegistered); ok {
								cl.skipped = err.Error()
							} else {
								mu.Lock()
								if firstErr == nil {
									firstErr = err
								}
								mu.Unlock()
							}
						} else {
							cl.s, cl.ttfts = summarize(res)
							for _, r := range reps {
								rs, _ := summarize(r)
								cl.reps = append(cl.reps, rs)
							}
							cl.note, cl.bucketSteps, cl.pred = res.note, res.bucketSteps, res.pred
						}
						cells[j.idx] = cl
					}
				}()
			}
			for _, j := range jobs {
				ch <- j
			}
			close(ch)
			wg.Wait()
			if firstErr != nil {
				return firstErr
			}
			rep.cells = append(rep.cells, cells...)
			fmt.Fprintf(stdout, "workload %s on %s: %d requests, capacity %.2f req/s, %d runs in %s\n",
				wn, c.name, len(w.reqs), cp, len(jobs), time.Since(t0).Round(time.Millisecond))
		}
	}
	if o.capacity {
		t0 := time.Now()
		cases := capacityCases(o, capWins, guesses)
		res, err := capacities(o, cases, o.capPolicies)
		if err != nil {
			return err
		}
		rep.capacity = res
		runs := 0
		for _, r := range res {
			runs += r.runs
			if r.k.scenario != sim.ScenarioNone {
				fmt.Fprintf(stdout, "scenario %s on %s/%s (%s, seeds %v): realised engine cost ratio %.4f over %d runs\n",
					r.k.scenario, r.k.workload, r.k.cluster, r.k.tpotName(), r.k.seeds, r.costRatio, r.runs)
			}
		}
		fmt.Fprintf(stdout, "capacity section: %d cases, %d policies, %d runs in %s\n", len(cases), len(o.capPolicies), runs, time.Since(t0).Round(time.Millisecond))
	}
	rep.elapsed = time.Since(start)
	rep.loadEnd = loadAverage()
	fmt.Fprintf(stdout, "machine load average at end: %s; wall time %s\n", rep.loadEnd, rep.elapsed.Round(time.Second))
	return rep.write(stdout)
}

// loadAverage is the machine's 1, 5 and 15 minute load averages ("unknown" where /proc
// does not say), so a reader can judge the wall times.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// repoRoot is the Tandem checkout the bench runs in (its traces and default -out live there).
func repoRoot() (string, error) {
	root, err := launch.FindRepoRoot()
	if err != nil {
		return "", fmt.Errorf("%w; or pass -out DIR", err)
	}
	return root, nil
}

// simulateReps runs the policy once per window: repetition k replays window k with Poisson
// arrivals and the picker's random source seeded by seed+k. It returns the pooled requests
// (the spans and busy times add up, so goodput and utilisation stay rates) and each run.
func simulateReps(wins []*workload, c clusterSpec, pol policy, o runOpts) (*runResult, []*runResult, error) {
	all := &runResult{busy: map[string]float64{}, pods: map[string]int{}}
	var each []*runResult
	for k, w := range wins {
		ok := o
		ok.seed = o.seed + uint64(k)
		res, err := simulate(w, c, pol, ok)
		if err != nil {
			return nil, nil, err
		}
		each = append(each, res)
		all.recs = append(all.recs, res.recs...)
		all.span += res.span
		all.length += res.length
		all.bucketSteps += res.bucketSteps
		all.stdIterations += res.stdIterations
		all.stdMixed += res.stdMixed
		for k, v := range res.busy {
			all.busy[k] += v
		}
		all.pods = res.pods
		all.pred = append(all.pred, res.pred...)
		if all.note == "" {
			all.note = res.note
		}
	}
	return all, each, nil
}
