package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/tandem-epp/tandem/internal/sim"
)

// runCheck runs -check on the first workload and shape instead of the report.
func runCheck(o *options, dataDir string, stdout io.Writer) error {
	if o.check == "advisor" {
		return checkAdvisor(o, dataDir, stdout)
	}
	wn, c := o.workloads[0], o.clusters[0]
	tr, err := readTrace(dataDir, wn)
	if err != nil {
		return err
	}
	w, err := tr.window(o.requests[wn], 0, o.params, o.seed, o.slo)
	if err != nil {
		return err
	}
	if o.check == "grid" {
		return checkGrid(o, w, c, stdout)
	}
	if o.check == "topology" {
		return checkTopology(o, w, stdout)
	}
	return checkStalls(o, w, c, stdout)
}

// checkStalls runs every policy under the first of -scenarios (seeds 1..-seeds, the
// scenario's and the picker's) at each of -loads × the reference rate, and prints each run's
// p99 TTFT, SLO share and the requests routed into a stalled pod per stalled pod-second
// (stallRouted), with those requests by the class of the stalled pod (P: it was the request's
// prefill pod, D: its decode pod, W: it ran the request whole) and by how far into the stall
// they arrived; then each policy's totals, and the cells where pd-predictive's p99 TTFT was
// worse than least-request-nopd's.
func checkStalls(o *options, w *workload, c clusterSpec, stdout io.Writer) error {
	scen := o.scenarios[0]
	rate := o.checkRate
	if rate == 0 {
		var err error
		if rate, err = capacity(w, c, o); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "check stalls: %s on %s, scenario %s, %d requests, loads × %.3f req/s, seeds 1..%d\n",
		w.name, c.name, scen, len(w.reqs), rate, o.seeds)
	type total struct{ hits, unseen, secs float64 }
	tot := map[string]*total{}
	worse, cells := 0, 0
	for _, l := range o.loads {
		for seed := uint64(1); seed <= uint64(o.seeds); seed++ {
			p99 := map[string]float64{}
			for _, p := range o.policies {
				res, err := simulate(w, c, p, runOpts{params: o.params, scrape: o.scrape, seed: seed, rate: l * rate, scenario: scen, scenarioSeed: seed})
				if err != nil {
					return err
				}
				s, _ := summarize(res)
				n, unseen, secs := res.stallRouted()
				if tot[p.name] == nil {
					tot[p.name] = &total{}
				}
				tot[p.name].hits += float64(n)
				tot[p.name].unseen += float64(unseen)
				tot[p.name].secs += secs
				p99[p.name] = s.ttftP99
				fmt.Fprintf(stdout, "load %.2f seed %d %s: p99 TTFT %.0f ms, SLO %.3f, %d routed into %.2f stalled pod-s (%.2f/s; %d before any evidence) %s\n",
					l, seed, p.name, s.ttftP99*1000, s.sloPct, n, secs, float64(n)/max(secs, 1e-9), unseen, stallDetail(res))
			}
			a, okA := p99["pd-predictive"]
			b, okB := p99["least-request-nopd"]
			if okA && okB {
				cells++
				if a > b {
					worse++
				}
			}
		}
	}
	for _, p := range o.policies {
		t := tot[p.name]
		fmt.Fprintf(stdout, "RESULT check_stall_routed_per_stall_second_%s=%.3f\n", p.name, t.hits/max(t.secs, 1e-9))
		fmt.Fprintf(stdout, "RESULT check_stall_routed_before_evidence_per_stall_second_%s=%.3f\n", p.name, t.unseen/max(t.secs, 1e-9))
	}
	if cells > 0 {
		fmt.Fprintf(stdout, "RESULT check_p99_ttft_worse_than_least-request-nopd_cells_pd-predictive=%d/%d\n", worse, cells)
	}
	return nil
}

// stallDetail breaks a run's requests routed into a stalled pod down by the stalled pod's
// class, its part in the request and how far into the stall the request arrived (ms).
func stallDetail(r *runResult) string {
	class := map[string]string{}
	byPod := map[string][]stallEvent{}
	for _, s := range r.stalls {
		byPod[s.pod] = append(byPod[s.pod], s)
	}
	for i := range r.recs {
		q := &r.recs[i]
		class[q.prefillPod], class[q.decodePod] = q.prefillOn, q.decodeOn
	}
	cnt := map[string]int{}
	for i := range r.recs {
		q := &r.recs[i]
		if q.failed != "" {
			continue
		}
		in := stallsOf(q, byPod)
		if len(in) == 0 {
			continue
		}
		s := in[0]
		part := "P"
		switch {
		case q.prefillPod == q.decodePod:
			part = "W"
		case s.pod == q.decodePod:
			part = "D"
		}
		age := ">300"
		for _, lim := range []float64{0.01, 0.02, 0.04, 0.1, 0.3} {
			if q.arrive-s.from < lim {
				age = fmt.Sprintf("<%.0f", lim*1000)
				break
			}
		}
		cnt[class[s.pod]+"/"+part+age]++
	}
	var ks []string
	for k := range cnt {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	out := make([]string, 0, len(ks))
	for _, k := range ks {
		out = append(out, fmt.Sprintf("%s:%d", k, cnt[k]))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// gridRates are the rates (req/s) checkGrid runs per TPOT objective (seconds): around
// pd-predictive's capacity on the mix at 4x1p1d+2s with llama8b-h100 pods, ±12 %.
var gridRates = map[float64][]float64{0.05: {230, 245, 260, 275, 290, 305}, 0.02: {160, 170, 180, 190, 200, 210}}

// checkGrid prints, per scenario of -scenarios and TPOT objective (50 and 20 ms), the share
// of requests meeting both objectives under each policy of -policies, averaged over a grid of
// rates around its capacity, per seed (1..-seeds; one for none) and over all. Near capacity
// that share is not monotonic in the rate (a capacity search's threshold crossing jumps), so
// the mean over a grid is the steadier comparison of two builds.
func checkGrid(o *options, w0 *workload, c clusterSpec, stdout io.Writer) error {
	for _, p := range o.policies {
		for _, sc := range o.scenarios {
			for _, tp := range []float64{0.05, 0.02} {
				w := withTPOT(w0, tp)
				seeds := o.seeds
				if sc == sim.ScenarioNone {
					seeds = 1
				}
				line := fmt.Sprintf("%s %-12s tpot%.0f:", p.name, sc, tp*1000)
				all, n := 0.0, 0
				for seed := uint64(1); seed <= uint64(seeds); seed++ {
					sum := 0.0
					for _, r := range gridRates[tp] {
						res, err := simulate(w, c, p, runOpts{params: o.params, scrape: o.scrape, seed: seed, rate: r, scenario: sc, scenarioSeed: seed})
						if err != nil {
							return err
						}
						s, _ := summarize(res)
						sum += s.sloPct
					}
					line += fmt.Sprintf(" %.4f", sum/float64(len(gridRates[tp])))
					all += sum
					n += len(gridRates[tp])
				}
				fmt.Fprintf(stdout, "%s  mean %.4f\n", line, all/float64(n))
			}
		}
	}
	return nil
}
