// Command live is the real-time routing benchmark (make bench-live): llm-d's vLLM simulator
// (llm-d-inference-sim, real processes, one per pod, on 127.0.0.1) as the engines, Tandem's
// cmd/epp on a pool file behind the local gateway (cmd/gateway in Envoy's stream-end mode) as
// the router, and a Poisson replay of the repository's traces with streaming requests, the same
// schedule for every router, the routers alternated. It reports per router and load p50/p99
// TTFT and TPOT, the success rate and the SLO goodput (bench/quality's objectives), with the
// machine's load average, since a real-time result on a shared machine depends on it.
//
// It owns the processes it starts, the schedule, the client and the report; it must not tune
// anything per router: every router sees the same pods, requests and instants.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/traces"
)

// router is one routing setup under test.
type router struct {
	name     string
	strategy string // Tandem's ROUTING_ALGORITHM; "" for the bench's own round-robin and llm-d
	about    string
}

// llmdRouter is llm-d's EPP, run when its binaries are given.
var llmdRouter = router{"llm-d", "", "llm-d-inference-scheduler v0.7.1 `cmd/epp` with its P/D configuration (prefix-based P/D decider, prefill/decode filters, prefix-cache scorer ×2 + queue scorer ×1, max-score picker) and its `pd-sidecar` on the decode and standard pods, the pods found through a kube-apiserver"}

// allRouters in report order. cmd/epp has no round-robin strategy (random is the nearest), so
// round-robin is the bench's client itself sending each request straight to the next pod that
// serves whole requests: it pays no gateway or EPP hop, which favours it.
var allRouters = []router{
	{"pd-predictive", "pd-predictive", "Tandem `pd-predictive`: pairs by predicted TTFT + TPOT from per-pod latency models fitted online, runs cheap prompts whole on decode pods, sends a request to a standard pod when predicted cheaper within the TPOT objective"},
	{"pd", "pd", "Tandem `pd` with its defaults (the seed's cascade: prefix_cache prefill, load_balancing decode, no prompt-length bucketing, so standard pods get nothing)"},
	{"least-request-nopd", "least-request", "Tandem `least-request`: the fewest requests in flight among the pods that serve whole requests (decode and standard), no disaggregation"},
	{"round-robin", "", "the bench's client, each request straight to the next decode or standard pod in turn, whole (no gateway, no EPP)"},
}

// baselines are the simple policies pd-predictive is measured against.
var baselines = []string{"least-request-nopd", "round-robin"}

type options struct {
	sim      string
	workload string
	requests int
	loads    []float64
	shape    shape
	routers  []router
	seed     uint64
	reps     int
	engine   engine
	slo      sloSpec
	out      string
	keepLogs bool
	maxOut   int
	llmdEPP  string
	sidecar  string
	// the SLO-goodput capacity search (-capacity): at most this many probes after the load grid
	capacity      bool
	capacitySteps int
}

func parseFlags(args []string, errOut io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench-live", flag.ContinueOnError)
	fs.SetOutput(errOut)
	o := &options{engine: defaultEngine, slo: defaultSLO}
	fs.StringVar(&o.sim, "sim", os.Getenv("TANDEM_LLMD_SIM"), "llm-d-inference-sim binary (default $TANDEM_LLMD_SIM; hack/ensure-llmd-sim.sh builds it)")
	fs.StringVar(&o.workload, "workload", "mix", "trace replayed: conv, code, mix (both Azure traces merged by arrival)")
	fs.IntVar(&o.requests, "requests", 160, "requests per router and load")
	loads := fs.String("loads", "0.7,1.0", "offered loads, fractions of the whole-request pods' saturation rate (printed)")
	pods := fs.String("pods", "2x1p1d+2s", "pool shape <rolesets>x<prefill>p<decode>d[+<standard>s]")
	routers := fs.String("routers", "", "routers to compare (default all): "+routerNames())
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the schedule (request order, prompts, arrival gaps) and of the simulators")
	fs.IntVar(&o.reps, "reps", 1, "repetitions of every router and load, the router order rotated each time")
	fs.IntVar(&o.engine.maxNumSeqs, "max-num-seqs", defaultEngine.maxNumSeqs, "simulator max-num-seqs (requests one pod runs at once)")
	fs.DurationVar(&o.engine.itl, "inter-token-latency", defaultEngine.itl, "simulator inter-token latency of one running request")
	fs.Float64Var(&o.engine.timeFactor, "time-factor-under-load", defaultEngine.timeFactor, "simulator slowdown at max-num-seqs running requests")
	fs.IntVar(&o.maxOut, "max-output", 0, "cut every request's output to this many tokens (0: the trace's own)")
	fs.StringVar(&o.llmdEPP, "llmd-epp", os.Getenv("TANDEM_LLMD_EPP"), "llm-d's EPP binary (llm-d-inference-scheduler cmd/epp; default $TANDEM_LLMD_EPP; hack/ensure-llmd-epp.sh builds it); \"\" leaves llm-d out")
	fs.StringVar(&o.sidecar, "llmd-sidecar", os.Getenv("TANDEM_LLMD_SIDECAR"), "llm-d's routing sidecar binary (cmd/pd-sidecar; default $TANDEM_LLMD_SIDECAR)")
	sloTPOT := fs.Duration("slo-tpot", time.Duration(defaultSLO.tpots[0]*float64(time.Second)), "the TPOT objective every request carries (x-slo-tpot-ms), which the routers are told and the capacity is judged at; goodput is reported at 50 ms and 20 ms as well")
	fs.BoolVar(&o.capacity, "capacity", false, "after the loads, search the SLO-goodput capacity (the highest load with ≥ 90 % of requests within both objectives, TPOT at -slo-tpot) of "+strings.Join(capacityRouters, ", ")+", searched from the loads' results to within 2 %")
	fs.IntVar(&o.capacitySteps, "capacity-steps", 6, "at most this many -capacity probes per router (one run each); a search ends sooner once its bracket is within 2 %")
	fs.StringVar(&o.out, "out", "", "also write the markdown report to this file")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "keep the processes' logs (their directory is printed)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: all settings are flags", fs.Args())
	}
	o.engine.itlStd = o.engine.itl * itlStdPercent / 100
	if *sloTPOT < time.Millisecond {
		return nil, fmt.Errorf("-slo-tpot %v: want at least 1ms, e.g. 20ms", *sloTPOT)
	}
	// The objective sent comes first: the routers', the capacity's and the headline goodput's.
	sent := sloTPOT.Seconds()
	o.slo.tpots = append([]float64{sent}, slices.DeleteFunc(slices.Clone(defaultSLO.tpots), func(x float64) bool { return x == sent })...)
	if o.sim == "" {
		return nil, errors.New("-sim: no llm-d-inference-sim binary; run hack/ensure-llmd-sim.sh and pass its output as -sim or TANDEM_LLMD_SIM")
	}
	if o.requests < 10 {
		return nil, fmt.Errorf("-requests %d: need at least 10", o.requests)
	}
	for _, f := range strings.Split(*loads, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("-loads %q: want positive fractions, e.g. 0.6,0.9", *loads)
		}
		o.loads = append(o.loads, v)
	}
	var err error
	if o.shape, err = parseShape(*pods); err != nil {
		return nil, err
	}
	o.routers = allRouters
	if *routers != "" {
		o.routers = nil
		for _, n := range strings.Split(*routers, ",") {
			if strings.TrimSpace(n) == llmdRouter.name {
				continue // added below when its binaries are given
			}
			i := slices.IndexFunc(allRouters, func(r router) bool { return r.name == strings.TrimSpace(n) })
			if i < 0 {
				return nil, fmt.Errorf("-routers: unknown router %q; valid: %s", n, routerNames())
			}
			o.routers = append(o.routers, allRouters[i])
		}
	}
	if o.llmdEPP != "" && o.sidecar == "" {
		return nil, errors.New("-llmd-epp needs -llmd-sidecar (llm-d's routing sidecar, which its decode pods run)")
	}
	if o.llmdEPP != "" && (*routers == "" || strings.Contains(*routers, llmdRouter.name)) {
		o.routers = append(o.routers, llmdRouter)
	}
	if o.reps < 1 {
		return nil, fmt.Errorf("-reps %d: need at least 1", o.reps)
	}
	return o, nil
}

func routerNames() string {
	var s []string
	for _, r := range allRouters {
		s = append(s, r.name)
	}
	s = append(s, llmdRouter.name+" (with -llmd-epp)")
	return strings.Join(s, ", ")
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-live:", err)
		os.Exit(2)
	}
	// SIGHUP too: a bench left running when its terminal or job ends still stops its
	// processes and removes its network namespaces.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	root, err := demo.FindRepoRoot()
	if err == nil {
		var dir string
		if dir, err = os.MkdirTemp("", "bench-live-bin-"); err == nil {
			defer os.RemoveAll(dir)
			fmt.Fprintln(os.Stderr, "bench-live: building cmd/epp and cmd/gateway")
			var bins binaries
			if bins, err = buildTandem(ctx, root, dir); err == nil {
				bins.sim, bins.llmdEPP, bins.sidecar = o.sim, o.llmdEPP, o.sidecar
				_, err = run(ctx, o, bins, os.Stdout, os.Stderr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-live:", err)
		os.Exit(1)
	}
}

// run starts the pods and the routers, replays the schedule at every load through every
// router, and writes the report to w (progress to progress). It returns the cells measured.
func run(ctx context.Context, o *options, bins binaries, w, progress io.Writer) ([]cell, error) {
	if _, err := os.Stat(bins.sim); err != nil {
		return nil, fmt.Errorf("-sim: %w (hack/ensure-llmd-sim.sh builds it)", err)
	}
	if bins.llmdEPP == "" {
		bins.sidecar = "" // llm-d's sidecars run beside llm-d's EPP only
	}
	load0 := loadAverage()
	rows, err := readWorkload(traces.Embedded(), o.workload)
	if err != nil {
		return nil, err
	}
	reqs, dropped, err := requestsOf(rows, o.requests, o.engine.maxModelLen, o.seed, o.engine, o.slo, o.maxOut)
	if err != nil {
		return nil, err
	}
	logDir, err := os.MkdirTemp("", "bench-live-")
	if err != nil {
		return nil, err
	}
	if !o.keepLogs {
		defer os.RemoveAll(logDir)
	}
	// llm-d's pool gives every pod one port: then every pod gets an address of its own.
	var pn *podNet
	if bins.llmdEPP != "" {
		n := o.shape.rolesets*(o.shape.prefill+o.shape.decode) + o.shape.standard
		if pn, err = newPodNet(n); err != nil {
			return nil, err
		}
		defer pn.close()
	}
	pods, err := startPods(ctx, logDir, bins, o.shape, o.engine, nil, o.seed, pn)
	if err != nil {
		return nil, err
	}
	defer stopPods(pods)
	poolFile := filepath.Join(logDir, "pool.yaml")
	if err := writePool(poolFile, pods); err != nil {
		return nil, err
	}
	var whole []string
	for _, p := range pods {
		if p.wholeRequest() {
			whole = append(whole, "http://"+p.addr())
		}
	}
	targets := map[string]target{}
	// metricsOf: each Tandem router's metrics URL, for its prediction ratios
	metricsOf := map[string]string{}
	// Each router's processes (its EPP, and its gateway) are stopped with SIGSTOP while the
	// others run, so an idle router's scraping does not take the CPU from the one measured.
	idle := map[string][]*proc{}
	for _, r := range o.routers {
		if r.name == llmdRouter.name {
			l, err := startLLMD(ctx, logDir, bins, pods)
			if err != nil {
				return nil, fmt.Errorf("llm-d's EPP: %w", err)
			}
			defer l.stop()
			targets[r.name] = func(int) string { return l.url }
			idle[r.name] = []*proc{l.epp, l.gw}
			continue
		}
		if r.strategy == "" {
			targets[r.name] = func(i int) string { return whole[i%len(whole)] }
			continue
		}
		t, err := startTandem(ctx, logDir, bins, poolFile, r.name, r.strategy)
		if err != nil {
			return nil, err
		}
		defer t.stop()
		targets[r.name] = func(int) string { return t.url }
		metricsOf[r.name] = t.metrics
		idle[r.name] = []*proc{t.epp, t.gw}
	}
	// activate continues the router's processes and stops every other router's; the stops are
	// undone before anything ends them (a stopped process does not act on SIGTERM).
	active := ""
	activate := func(name string) {
		if name == active {
			return
		}
		for n, ps := range idle {
			for _, p := range ps {
				p.signal(n == name)
			}
		}
		active = name
		if len(idle[name]) > 0 {
			time.Sleep(2 * time.Second) // a fresh scrape of every pod before the first request
		}
	}
	defer func() {
		for _, ps := range idle {
			for _, p := range ps {
				p.signal(true)
			}
		}
	}()
	sat := o.engine.saturation(reqs, len(whole))
	fmt.Fprintf(progress, "bench-live: %d pods (%s), %d requests per run, saturation %.2f req/s; logs in %s\n",
		len(pods), o.shape, len(reqs), sat, logDir)

	var cells []cell
	results := map[string][]runRecord{}
	key := func(r string, l float64) string { return r + "@" + resultKey(l) }
	runIdx := 0
	textSeed := uint64(0)
	for rep := range o.reps {
		for li, load := range o.loads {
			textSeed++
			sched := schedule(reqs, load*sat, o.seed+uint64(rep)*7919, o.seed<<20+textSeed)
			order := slices.Clone(o.routers)
			rot := (rep*len(o.loads) + li) % len(order)
			order = append(order[rot:], order[:rot]...)
			for _, r := range order {
				activate(r.name)
				before, err := servedByRole(ctx, pods)
				if err != nil {
					return nil, err
				}
				predBefore, err := readPredictions(ctx, metricsOf[r.name])
				if err != nil {
					return nil, err
				}
				begin := time.Now()
				res := replay(ctx, sched, targets[r.name], o.slo.tpots[0]) // the objective sent
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				placed, err := servedByRole(ctx, pods)
				if err != nil {
					return nil, err
				}
				for role := range placed {
					placed[role] -= before[role]
				}
				pred, err := readPredictions(ctx, metricsOf[r.name])
				if err != nil {
					return nil, err
				}
				for kind, h := range pred {
					d, ok := h.minus(predBefore[kind])
					if !ok {
						fmt.Fprintf(progress, "bench-live: %s's %s prediction ratios went back or changed buckets during the run (did its EPP restart?): left out\n", r.name, kind)
						delete(pred, kind)
						continue
					}
					pred[kind] = d
				}
				runIdx++
				k := key(r.name, load)
				rec := runRecord{sched, res, placed, pred}
				results[k] = append(results[k], rec)
				s := summarise([]runRecord{rec}, o.slo)
				fmt.Fprintf(progress, "bench-live: run %d: %s at load %g (%.2f req/s): %.0fs, success %.3f, TTFT p99 %s ms, goodput %.3f; load average %s\n",
					runIdx, r.name, load, load*sat, time.Since(begin).Seconds(), s.success(), ms(s.ttft99), s.good[0], loadAverage())
				for e, n := range s.errs {
					fmt.Fprintf(progress, "bench-live:   %d × %s\n", n, e)
				}
			}
		}
	}
	for _, load := range o.loads {
		for _, r := range o.routers {
			s := summarise(results[key(r.name, load)], o.slo)
			s.rate = load * sat
			cells = append(cells, cell{router: r.name, load: load, s: s, runs: results[key(r.name, load)]})
		}
	}
	var caps []capacity
	if o.capacity {
		probe := func(r router, load float64) (float64, error) {
			textSeed++
			sched := schedule(reqs, load*sat, o.seed, o.seed<<20+textSeed)
			activate(r.name)
			res := replay(ctx, sched, targets[r.name], o.slo.tpots[0]) // the objective sent
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			g := summarise([]runRecord{{sched, res, nil, nil}}, o.slo).good[0]
			fmt.Fprintf(progress, "bench-live: capacity probe: %s at load %.3g (%.2f req/s): goodput %.3f; load average %s\n", r.name, load, load*sat, g, loadAverage())
			return g, nil
		}
		for _, r := range o.routers {
			if !slices.Contains(capacityRouters, r.name) {
				continue
			}
			var grid []float64
			for _, c := range cells {
				if c.router == r.name {
					grid = append(grid, c.load, c.s.good[0])
				}
			}
			c, err := searchCapacity(grid, o.capacitySteps, func(l float64) (float64, error) { return probe(r, l) })
			if err != nil {
				return nil, err
			}
			c.router = r.name
			c.rps = c.load * sat
			caps = append(caps, c)
		}
	}
	report := func(w io.Writer) {
		fmt.Fprintf(w, "# bench-live\n\n")
		fmt.Fprintf(w, "Workload %s (%d requests a run, %d passed over for -max-model-len), pool %s, %d repetition(s), seed %d.\n",
			o.workload, len(reqs), dropped, o.shape, o.reps, o.seed)
		fmt.Fprintf(w, "Engine (llm-d-inference-sim, every pod): %s.\n", o.engine.describe())
		fmt.Fprintf(w, "Saturation of the %d whole-request pods: %.2f req/s. SLO: TTFT ≤ max(%gs, %g× idle prefill); TPOT ≤ %v ms (every request carries %.0f ms). Load average at start %s, at end %s.\n\n",
			len(whole), sat, o.slo.ttft, o.slo.ttftPrefill, tpotList(o.slo), o.slo.tpots[0]*1000, load0, loadAverage())
		writeTable(w, cells, o.slo)
		fmt.Fprintln(w)
		writeCapacities(w, caps, o.slo.tpots[0])
		writePredictions(w, cells)
		for _, r := range o.routers {
			fmt.Fprintf(w, "- `%s`: %s\n", r.name, r.about)
		}
		fmt.Fprintln(w)
	}
	report(w)
	fmt.Fprintf(w, "RESULT live_load_average_start=%s\n", firstField(load0))
	fmt.Fprintf(w, "RESULT live_load_average_end=%s\n", firstField(loadAverage()))
	fmt.Fprintf(w, "RESULT live_saturation_rps=%.3f\n", sat)
	writeResults(w, cells, o.slo, baselines)
	writeCapacityResults(w, caps)
	if o.out != "" {
		f, err := os.Create(o.out)
		if err != nil {
			return cells, err
		}
		report(f)
		if err := f.Close(); err != nil {
			return cells, err
		}
	}
	return cells, nil
}

func tpotList(s sloSpec) string {
	var x []string
	for _, t := range s.tpots {
		x = append(x, fmt.Sprintf("%.0f", t*1000))
	}
	return strings.Join(x, " / ")
}

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return "nan"
}
