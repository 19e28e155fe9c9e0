// Command quality is the routing-quality benchmark (make bench-quality): it replays real
// traces (Azure LLM 2023 conv and code, their mix, Mooncake) through the real Tandem picker
// in virtual time, over simulated engine pods that use internal/sim's latency model, and
// compares routing policies on the latency users feel: TTFT, TPOT, end-to-end, SLO goodput.
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

	"github.com/tandem-epp/tandem/internal/sim"
)

// SLO bounds for goodput. TTFT: 2 s, or twice the request's own prefill time on an idle pod
// when that is longer (a 40k-token Mooncake prompt cannot prefill in 2 s on any pod).
// TPOT: 20 ms, the model's inter-token latency at a batch of 50 of 64.
const (
	sloTTFT        = 2.0
	sloTTFTPrefill = 2.0
	sloTPOT        = 0.020
)

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
	params    sim.Params
}

var defaultRequests = map[string]int{"conv": 1500, "code": 1500, "mix": 2000, "mooncake": 600}

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
	loads := fs.String("loads", "0.5,0.8,1.0,1.2", "offered loads as fractions of the measured capacity")
	clusters := fs.String("clusters", "4x1p1d+2s,1x8p8d", "cluster shapes <rolesets>x<prefill>p<decode>d[+<standard>s], comma-separated (e.g. 4x1p1d+2s,1x8p8d)")
	pols := fs.String("policies", "", "policies to compare (default all): "+policyNames())
	reqs := fs.Int("requests", 0, "requests per workload (0: conv 1500, code 1500, mix 2000, mooncake 600)")
	out := fs.String("out", "", "output directory (default bench/quality/out under the repository)")
	docs := fs.String("docs", "", "also copy the markdown table and PNGs here (e.g. docs/quality)")
	data := fs.String("data", "", "trace directory (default traces/ in the repository)")
	scrape := fs.Duration("scrape", time.Second, "metric scrape interval (the gateway default is 1s)")
	workers := fs.Int("workers", min(2, runtime.NumCPU()), "runs simulated in parallel")
	validate := fs.Bool("validate", true, "compare the virtual-time engine with the real-time simulator first")
	valScale := fs.Float64("validate-scale", valTimeScale, "time scale of the real-time simulator in the check (wall = model × scale)")
	reps := fs.Int("reps", 3, "repetitions per run with seeds seed, seed+1, …; their requests are pooled")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o := &options{args: reportArgs(args), seed: *seed, outDir: *out, docsDir: *docs, dataDir: *data, scrape: scrape.Seconds(),
		workers: max(1, *workers), validate: *validate, valScale: *valScale, reps: *reps, params: sim.DefaultParams(), requests: map[string]int{}}
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
	if len(o.workloads) == 0 || len(o.loads) == 0 || len(o.clusters) == 0 || len(o.policies) == 0 {
		return nil, fmt.Errorf("need at least one workload, load, cluster and policy")
	}
	return o, nil
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

// capacity offers the whole window at once (arrivals compressed 10⁴×) and measures the
// completion rate between the 10th and 90th percentile completion, which leaves out the
// ramp-up and the tail of the last long requests.
func capacity(w *workload, c clusterSpec, o *options) (float64, error) {
	pol := allPolicies[slices.IndexFunc(allPolicies, func(p policy) bool { return p.name == capacityPolicy })]
	res, err := simulate(w, c, pol, runOpts{params: o.params, scrape: o.scrape, seed: o.seed, timeMult: 1e-4})
	if err != nil {
		return 0, err
	}
	var done []float64
	for _, r := range res.recs {
		if r.failed == "" {
			done = append(done, r.done)
		}
	}
	slices.Sort(done)
	if len(done) < 10 {
		return 0, fmt.Errorf("capacity run of %s: only %d requests completed", w.name, len(done))
	}
	lo, hi := done[len(done)/10], done[len(done)*9/10]
	if hi <= lo {
		return 0, fmt.Errorf("capacity run of %s: no spread in completion times", w.name)
	}
	return float64(len(done)*9/10-len(done)/10) / (hi - lo), nil
}

// cell is one run's summary.
type cell struct {
	workload, cluster, policy string
	load                      float64
	rate                      float64 // offered requests/s
	s                         summary
	ttfts                     []float64 // sorted, for the CDF
	note                      string
	skipped                   string
	bucketSteps               int
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
	rep := &report{o: o, started: start}
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
			w, err := loadWorkload(dataDir, wn, o.requests[wn], o.params, o.seed)
			if err != nil {
				return err
			}
			cp, err := capacity(w, c, o)
			if err != nil {
				return err
			}
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
						mult := traceRate / rate
						cl := cell{workload: wn, cluster: c.name, policy: j.pol.name, load: j.load, rate: rate}
						res, err := simulateReps(w, c, j.pol, runOpts{params: o.params, scrape: o.scrape, seed: o.seed, timeMult: mult}, o.reps)
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
							cl.s, cl.ttfts = summarize(res, o.params)
							cl.note, cl.bucketSteps = res.note, res.bucketSteps
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
	rep.elapsed = time.Since(start)
	return rep.write(stdout)
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s; run from the repository or pass -out DIR", dir)
		}
	}
}

// simulateReps runs the policy reps times, seeding the picker's random source with seed,
// seed+1, …, and pools the requests (the span adds up, so goodput stays a rate).
func simulateReps(w *workload, c clusterSpec, pol policy, o runOpts, reps int) (*runResult, error) {
	all := &runResult{}
	for k := 0; k < reps; k++ {
		ok := o
		ok.seed = o.seed + uint64(k)
		res, err := simulate(w, c, pol, ok)
		if err != nil {
			return nil, err
		}
		all.recs = append(all.recs, res.recs...)
		all.span += res.span
		all.bucketSteps += res.bucketSteps
		if all.note == "" {
			all.note = res.note
		}
	}
	return all, nil
}
