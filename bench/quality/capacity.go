package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/tandem-epp/tandem/internal/sim"
)

// SLO-goodput capacity (DistServe's goodput): the highest steady (Poisson) request rate at
// which at least goodFraction of the measured requests meet both their TTFT and TPOT
// objectives, searched for each policy separately to within capTolerance, and compared with
// the best of the baselines: the simple policies a user would otherwise run.

const (
	goodFraction = 0.90
	capTolerance = 1.02 // the search stops when hi/lo ≤ this
	tieRatio     = 0.98 // a capacity ratio at or above this is a tie
	capStep      = 1.5  // bracketing step from the first guess
	capSteps     = 12   // bracketing steps each way before giving up
)

// baselines are the simple policies every other is measured against: round-robin and
// least-request over every pod that serves a whole request, least_request with PD, and the
// seed's default PD configuration.
var baselines = []string{"round-robin", "least-request-nopd", "least_request", "seed-default"}

func isBaseline(name string) bool { return slices.Contains(baselines, name) }

// searchCapacity finds the highest rate at which meets is true, to within capTolerance,
// starting from guess: it brackets by capStep steps, then bisects geometrically. It returns 0
// when no rate down to guess/capStep^capSteps meets the objectives, and the highest rate tried
// when every rate up to guess·capStep^capSteps does. tried is how many rates it ran.
func searchCapacity(guess float64, meets func(rate float64) (bool, error)) (capacity float64, tried int, err error) {
	lo, hi := 0.0, 0.0
	ok, err := meets(guess)
	tried++
	if err != nil {
		return 0, tried, err
	}
	if ok {
		lo = guess
		for i := 0; i < capSteps && hi == 0; i++ {
			r := lo * capStep
			if ok, err = meets(r); err != nil {
				return 0, tried, err
			}
			tried++
			if ok {
				lo = r
			} else {
				hi = r
			}
		}
		if hi == 0 {
			return lo, tried, nil
		}
	} else {
		hi = guess
		for i := 0; i < capSteps && lo == 0; i++ {
			r := hi / capStep
			if ok, err = meets(r); err != nil {
				return 0, tried, err
			}
			tried++
			if ok {
				lo = r
			} else {
				hi = r
			}
		}
		if lo == 0 {
			return 0, tried, nil
		}
	}
	for hi/lo > capTolerance {
		mid := math.Sqrt(lo * hi)
		ok, err := meets(mid)
		tried++
		if err != nil {
			return 0, tried, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, tried, nil
}

// capCase is one comparison: a workload window on a shape under an engine scenario and a
// TPOT objective, over seeds.
type capCase struct {
	workload, cluster, scenario string
	tpot                        float64 // seconds
	w                           *workload
	c                           clusterSpec
	guess                       float64 // the first rate tried (the seed default's sustained rate)
	seeds                       []uint64
}

func (k capCase) tpotName() string { return fmt.Sprintf("tpot%.0f", k.tpot*1000) }

// capRow is one policy's result in a case.
type capRow struct {
	policy    string
	caps      []float64 // per seed
	ratio     float64   // worst over seeds of capacity ÷ the best baseline's capacity (+Inf: the baselines met the objectives at no rate)
	ttft80    float64   // p99 TTFT at 80 % and 100 % of the best baseline's capacity (first seed; NaN: not run)
	ttft100   float64
	stallRate float64 // requests routed into a stalled pod per stalled pod-second, at 100 % (stall scenarios)
	hasStall  bool
}

// capResult is a case's outcome.
type capResult struct {
	k         capCase
	rows      []capRow
	best      string    // the best baseline (first seed)
	bestCaps  []float64 // the best baseline's capacity per seed
	costRatio float64   // realised engine cost ratio over every run of the case
	runs      int
}

// withTPOT is the workload with every request's TPOT objective set to tpot.
func withTPOT(w *workload, tpot float64) *workload {
	c := *w
	c.reqs = slices.Clone(w.reqs)
	for i := range c.reqs {
		c.reqs[i].sloTPOT = tpot
	}
	return &c
}

// capacityCases lists what the capacity section covers: scenario none on every workload and
// shape; the other scenarios on the mix at the first shape, or (-full) everywhere; every
// TPOT objective.
func capacityCases(o *options, wins map[string]*workload, guesses map[string]float64) []capCase {
	var cs []capCase
	for ci, c := range o.clusters {
		for _, wn := range o.workloads {
			w := wins[c.name+"/"+wn]
			for _, sc := range o.scenarios {
				if sc != sim.ScenarioNone && !o.full && (ci != 0 || (wn != "mix" && len(o.workloads) > 1)) {
					continue
				}
				seeds := []uint64{o.seed}
				if sc != sim.ScenarioNone {
					seeds = nil
					for k := range o.seeds {
						seeds = append(seeds, o.seed+uint64(k))
					}
				}
				for _, tp := range o.capTPOTs {
					cs = append(cs, capCase{workload: wn, cluster: c.name, scenario: sc, tpot: tp, w: withTPOT(w, tp), c: c,
						guess: guesses[c.name+"/"+wn], seeds: seeds})
				}
			}
		}
	}
	return cs
}

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(n, workers int, f func(i int) error) error {
	ch := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range max(1, workers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ch {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		ch <- i
	}
	close(ch)
	wg.Wait()
	return first
}

// capacities runs the capacity section: a search per case, policy and seed, then p99 TTFT
// at 80 % and 100 % of the best baseline's capacity.
func capacities(o *options, cases []capCase, pols []policy) ([]*capResult, error) {
	type search struct {
		ci, pi, si int
	}
	results := make([]*capResult, len(cases))
	var jobs []search
	for ci, k := range cases {
		results[ci] = &capResult{k: k, rows: make([]capRow, len(pols))}
		for pi, p := range pols {
			results[ci].rows[pi] = capRow{policy: p.name, caps: make([]float64, len(k.seeds)), ttft80: math.NaN(), ttft100: math.NaN()}
			for si := range k.seeds {
				jobs = append(jobs, search{ci, pi, si})
			}
		}
	}
	var mu sync.Mutex
	base, pert := make([]float64, len(cases)), make([]float64, len(cases))
	runOne := func(ci int, pol policy, seed uint64, rate float64) (*runResult, error) {
		k := cases[ci]
		res, err := simulate(k.w, k.c, pol, runOpts{params: o.params, scrape: o.scrape, seed: seed, rate: rate,
			scenario: k.scenario, scenarioSeed: seed})
		if err != nil {
			return nil, err
		}
		mu.Lock()
		base[ci] += res.baseSeconds
		pert[ci] += res.scenSeconds
		results[ci].runs++
		mu.Unlock()
		return res, nil
	}
	err := parallel(len(jobs), o.workers, func(i int) error {
		j := jobs[i]
		k := cases[j.ci]
		seed := k.seeds[j.si]
		cp, _, err := searchCapacity(k.guess, func(rate float64) (bool, error) {
			res, err := runOne(j.ci, pols[j.pi], seed, rate)
			if err != nil {
				return false, err
			}
			s, _ := summarize(res)
			return s.sloPct >= goodFraction, nil
		})
		results[j.ci].rows[j.pi].caps[j.si] = cp
		return err
	})
	if err != nil {
		return nil, err
	}
	// The best baseline per seed, and each policy's worst ratio over seeds.
	for _, r := range results {
		r.bestCaps = make([]float64, len(r.k.seeds))
		for si := range r.k.seeds {
			for _, row := range r.rows {
				if isBaseline(row.policy) && row.caps[si] > r.bestCaps[si] {
					r.bestCaps[si] = row.caps[si]
					if si == 0 {
						r.best = row.policy
					}
				}
			}
		}
		for i := range r.rows {
			row := &r.rows[i]
			row.ratio = math.Inf(1)
			for si := range r.k.seeds {
				if r.bestCaps[si] > 0 {
					row.ratio = min(row.ratio, row.caps[si]/r.bestCaps[si])
				}
			}
		}
	}
	// p99 TTFT at 80 % and 100 % of the best baseline's capacity (first seed).
	type tjob struct{ ci, pi, li int }
	var tjobs []tjob
	for ci, r := range results {
		if r.bestCaps[0] == 0 {
			continue
		}
		for pi := range pols {
			tjobs = append(tjobs, tjob{ci, pi, 0}, tjob{ci, pi, 1})
		}
	}
	err = parallel(len(tjobs), o.workers, func(i int) error {
		j := tjobs[i]
		r := results[j.ci]
		frac := []float64{0.8, 1.0}[j.li]
		res, err := runOne(j.ci, pols[j.pi], r.k.seeds[0], frac*r.bestCaps[0])
		if err != nil {
			return err
		}
		s, _ := summarize(res)
		row := &r.rows[j.pi]
		if j.li == 0 {
			row.ttft80 = s.ttftP99
		} else {
			row.ttft100 = s.ttftP99
			if n, _, secs := res.stallRouted(); secs > 0 {
				row.stallRate, row.hasStall = float64(n)/secs, true
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for ci, r := range results {
		r.costRatio = 1
		if base[ci] > 0 {
			r.costRatio = pert[ci] / base[ci]
		}
	}
	return results, nil
}

func fmtRatio(x float64) string {
	if math.IsInf(x, 1) {
		return "inf"
	}
	return fmt.Sprintf("%.3f", x)
}

func fmtCap(x float64, inf bool) string {
	if inf {
		return "inf"
	}
	return fmt.Sprintf("%.3f", x)
}

// writeCapacity prints the capacity section (markdown) and returns its RESULT lines, new
// ones first.
func writeCapacity(md io.Writer, o *options, results []*capResult) []string {
	var lines, worstLines, bestLines []string
	worst := map[string]float64{}
	var order []string
	stall := map[string]float64{}
	fmt.Fprintf(md, "\n## SLO-goodput capacity against the best baseline\n\n"+
		"Capacity: the highest Poisson request rate (req/s) at which ≥ %.0f %% of the measured requests meet both the TTFT "+
		"objective and the TPOT objective of the column, searched per policy to within %.0f %%; baselines: %s. Ratio: the "+
		"policy's capacity ÷ the best baseline's, the worst over the seeds (≥ %.2f is a tie; `inf` when no baseline met the "+
		"objectives at any rate tried). p99 TTFT at 80 %% and 100 %% of the best baseline's capacity (first seed). Engine "+
		"scenarios perturb the pods' iteration costs at an unchanged mean (realised ratio printed); the router is not told.\n",
		goodFraction*100, (capTolerance-1)*100, strings.Join(baselines, ", "), tieRatio)
	bestDone := map[string]bool{}
	for _, r := range results {
		k := r.k
		inf := r.bestCaps[0] == 0
		fmt.Fprintf(md, "\n### %s on %s, scenario %s, TPOT %.0f ms (seeds %v; realised engine cost ratio %.3f over %d runs)\n\n"+
			"| policy | capacity req/s (per seed) | ratio vs best baseline | p99 TTFT @80 %% (ms) | p99 TTFT @100 %% (ms) |\n|---|---|---|---|---|\n",
			k.workload, k.cluster, k.scenario, k.tpot*1000, k.seeds, r.costRatio, r.runs)
		for _, row := range r.rows {
			var cs []string
			for _, c := range row.caps {
				cs = append(cs, fmt.Sprintf("%.3f", c))
			}
			capStr := strings.Join(cs, " / ")
			if inf {
				capStr = "inf (" + capStr + ")"
			}
			tie := ""
			if !math.IsInf(row.ratio, 1) && row.ratio >= tieRatio && row.ratio < 1/tieRatio && !isBaseline(row.policy) {
				tie = " (tie)"
			}
			fmt.Fprintf(md, "| %s | %s | %s%s | %s | %s |\n", row.policy, capStr, fmtRatio(row.ratio), tie, ms(row.ttft80), ms(row.ttft100))
			lines = append(lines, fmt.Sprintf("RESULT capacity_ratio_vs_best_baseline_%s_%s_%s_%s_%s=%s", k.workload, k.cluster, k.scenario, k.tpotName(), row.policy, fmtRatio(row.ratio)))
			if _, ok := worst[row.policy]; !ok {
				worst[row.policy] = math.Inf(1)
				order = append(order, row.policy)
			}
			worst[row.policy] = min(worst[row.policy], row.ratio)
			if row.hasStall && k.scenario == sim.ScenarioStalls && k.cluster == o.clusters[0].name && k.tpot == o.capTPOTs[0] {
				if _, ok := stall[row.policy]; !ok {
					stall[row.policy] = row.stallRate
				}
			}
		}
		fmt.Fprintf(md, "\nBest baseline: **%s** (%s req/s).\n", r.best, fmtCap(r.bestCaps[0], inf))
		key := k.workload + "_" + k.cluster + "_" + k.tpotName()
		if k.scenario == sim.ScenarioNone && !bestDone[key] {
			bestDone[key] = true
			best := r.best
			if inf {
				best = "inf"
			}
			bestLines = append(bestLines, fmt.Sprintf("RESULT best_baseline_%s=%s", key, best))
		}
	}
	for _, p := range order {
		worstLines = append(worstLines, fmt.Sprintf("RESULT worst_capacity_ratio_vs_best_baseline_%s=%s", p, fmtRatio(worst[p])))
	}
	var stallLines []string
	for _, p := range order {
		if v, ok := stall[p]; ok {
			stallLines = append(stallLines, fmt.Sprintf("RESULT stall_routed_per_stall_second_%s=%.3f", p, v))
		}
	}
	out := append(worstLines, bestLines...)
	out = append(out, lines...)
	return append(out, stallLines...)
}
