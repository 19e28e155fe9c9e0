package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
)

// stats summarise one router at one load over the measured requests (the middle 80 % of the
// schedule by arrival, leaving out warm-up and drain, as bench/quality does).
type stats struct {
	n, ok              int
	ttft50, ttft99     float64 // seconds, over the successful requests
	tpot50, tpot99     float64 // seconds, over the successful requests of two tokens or more
	good               []float64
	goodRate           []float64 // good requests per second of the measured arrivals
	errs               map[string]int
	placed             map[string]float64 // per role, over every repetition's whole run
	rate, spanMeasured float64
	// pred: the router's observed ÷ predicted TTFT by route kind, over every repetition's
	// whole run (empty: it predicts nothing)
	pred map[string]ratioHist
}

// measured is the index range [lo, hi) of the requests counted.
func measured(n int) (int, int) {
	cut := n / 10
	return cut, n - cut
}

// run is one replay of a schedule through one router.
type runRecord struct {
	reqs   []request
	res    []result
	placed map[string]float64   // requests each role's pods finished during the run
	pred   map[string]ratioHist // the run's prediction ratios by route kind (nil: none)
}

// summarise pools the measured window of every repetition of one router at one load.
func summarise(runs []runRecord, slo sloSpec) stats {
	s := stats{errs: map[string]int{}, placed: map[string]float64{}, pred: map[string]ratioHist{}, good: make([]float64, len(slo.tpots)), goodRate: make([]float64, len(slo.tpots))}
	var ttfts, tpots []float64
	for _, x := range runs {
		lo, hi := measured(len(x.reqs))
		for role, n := range x.placed {
			s.placed[role] += n
		}
		for kind, h := range x.pred {
			sum, ok := s.pred[kind].add(h)
			if !ok {
				fmt.Fprintf(os.Stderr, "bench-live: %s prediction ratios of one repetition have other buckets: left out\n", kind)
			}
			s.pred[kind] = sum
		}
		s.n += hi - lo
		s.spanMeasured += x.reqs[hi-1].at - x.reqs[lo].at
		for i := lo; i < hi; i++ {
			r := x.res[i]
			if !r.ok {
				s.errs[firstWords(r.err)]++
				continue
			}
			s.ok++
			ttfts = append(ttfts, r.ttft)
			if r.tokens > 1 {
				tpots = append(tpots, r.tpot)
			}
			for k, tp := range slo.tpots {
				if r.ttft <= x.reqs[i].sloTTFT && (r.tokens <= 1 || r.tpot <= tp) {
					s.good[k]++
				}
			}
		}
	}
	s.ttft50, s.ttft99 = quantile(ttfts, 0.5), quantile(ttfts, 0.99)
	s.tpot50, s.tpot99 = quantile(tpots, 0.5), quantile(tpots, 0.99)
	for k := range s.good {
		if s.spanMeasured > 0 {
			s.goodRate[k] = s.good[k] / s.spanMeasured
		}
		s.good[k] /= float64(max(1, s.n))
	}
	return s
}

func (s stats) success() float64 { return float64(s.ok) / float64(max(1, s.n)) }

// firstWords keeps an error's kind for the report (an address or body would make every one
// unique).
func firstWords(e string) string {
	if len(e) > 60 {
		e = e[:60]
	}
	return e
}

// quantile is the q-quantile (nearest rank) of xs; NaN when there are none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// cell is one router at one load.
type cell struct {
	router string
	load   float64
	s      stats
	runs   []runRecord
}

// loadAverage is /proc/loadavg's first three fields ("" where there is none).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func ms(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%.0f", x*1000)
}

// writeTable prints the markdown table: one row per router and load.
func writeTable(w io.Writer, cells []cell, slo sloSpec) {
	fmt.Fprintf(w, "| load | rate (req/s) | router | requests | success | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | TPOT p99 (ms) | served on prefill / decode / standard pods |")
	for _, tp := range slo.tpots {
		fmt.Fprintf(w, " goodput tpot%.0f |", tp*1000)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "|---|---|---|---|---|---|---|---|---|---|")
	for range slo.tpots {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for _, c := range cells {
		fmt.Fprintf(w, "| %.2g | %.2f | %s | %d | %.3f | %s | %s | %s | %s | %.0f / %.0f / %.0f |", c.load, c.s.rate, c.router, c.s.n, c.s.success(),
			ms(c.s.ttft50), ms(c.s.ttft99), ms(c.s.tpot50), ms(c.s.tpot99), c.s.placed["prefill"], c.s.placed["decode"], c.s.placed["standard"])
		for k := range slo.tpots {
			fmt.Fprintf(w, " %.3f (%.2f/s) |", c.s.good[k], c.s.goodRate[k])
		}
		fmt.Fprintln(w)
	}
}

// resultKey is a RESULT name's load part: 0.9 → "0.9".
func resultKey(load float64) string { return fmt.Sprintf("%g", load) }

// writeResults prints the RESULT lines: per router and load, and pd-predictive against the
// best baseline (the lowest p99 TTFT, the highest goodput among the baselines run).
func writeResults(w io.Writer, cells []cell, slo sloSpec, baselines []string) {
	f := func(x float64) string {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return "nan"
		}
		return fmt.Sprintf("%.4g", x)
	}
	for _, c := range cells {
		k := c.router + "_" + resultKey(c.load)
		fmt.Fprintf(w, "RESULT live_success_%s=%s\n", k, f(c.s.success()))
		fmt.Fprintf(w, "RESULT live_ttft_p50_ms_%s=%s\n", k, f(c.s.ttft50*1000))
		fmt.Fprintf(w, "RESULT live_ttft_p99_ms_%s=%s\n", k, f(c.s.ttft99*1000))
		fmt.Fprintf(w, "RESULT live_tpot_p50_ms_%s=%s\n", k, f(c.s.tpot50*1000))
		fmt.Fprintf(w, "RESULT live_tpot_p99_ms_%s=%s\n", k, f(c.s.tpot99*1000))
		for j, tp := range slo.tpots {
			fmt.Fprintf(w, "RESULT live_goodput_tpot%.0f_%s=%s\n", tp*1000, k, f(c.s.good[j]))
		}
		for _, kind := range slices.Sorted(maps.Keys(c.s.pred)) {
			h := c.s.pred[kind]
			if h.n() == 0 {
				continue
			}
			for _, q := range []float64{0.1, 0.5, 0.9} {
				fmt.Fprintf(w, "RESULT live_ttft_prediction_ratio_p%.0f_%s_%s=%s\n", q*100, kind, k, f(h.quantile(q)))
			}
		}
	}
	byLoad := map[float64][]cell{}
	var loads []float64
	for _, c := range cells {
		if _, ok := byLoad[c.load]; !ok {
			loads = append(loads, c.load)
		}
		byLoad[c.load] = append(byLoad[c.load], c)
	}
	worstVsLLMD := math.NaN()
	for _, l := range loads {
		var pred, ld *cell
		for i, c := range byLoad[l] {
			switch c.router {
			case "pd-predictive":
				pred = &byLoad[l][i]
			case "llm-d":
				ld = &byLoad[l][i]
			}
		}
		if pred == nil || ld == nil {
			continue
		}
		r := pred.s.ttft99 / ld.s.ttft99
		fmt.Fprintf(w, "RESULT live_ttft_p99_ratio_vs_llmd_%s=%s\n", resultKey(l), f(r))
		for j, tp := range slo.tpots {
			if ld.s.good[j] > 0 {
				fmt.Fprintf(w, "RESULT live_goodput_tpot%.0f_ratio_vs_llmd_%s=%s\n", tp*1000, resultKey(l), f(pred.s.good[j]/ld.s.good[j]))
			}
		}
		fmt.Fprintf(w, "RESULT live_success_minus_llmd_%s=%s\n", resultKey(l), f(pred.s.success()-ld.s.success()))
		if math.IsNaN(worstVsLLMD) || r > worstVsLLMD {
			worstVsLLMD = r
		}
	}
	if !math.IsNaN(worstVsLLMD) {
		// the goal's form: pd-predictive's p99 TTFT over llm-d's at equal load, the worst load
		fmt.Fprintf(w, "RESULT live_ttft_p99_ratio_vs_llmd=%s\n", f(worstVsLLMD))
	}
	for _, l := range loads {
		var pred *cell
		bestP99, bestGood := math.Inf(1), -1.0
		for i, c := range byLoad[l] {
			if c.router == "pd-predictive" {
				pred = &byLoad[l][i]
			}
			if slices.Contains(baselines, c.router) {
				bestP99 = min(bestP99, c.s.ttft99)
				bestGood = max(bestGood, c.s.good[0])
			}
		}
		if pred == nil || bestGood < 0 {
			continue
		}
		fmt.Fprintf(w, "RESULT live_ttft_p99_ratio_vs_best_baseline_%s=%s\n", resultKey(l), f(pred.s.ttft99/bestP99))
		if bestGood > 0 {
			fmt.Fprintf(w, "RESULT live_goodput_ratio_vs_best_baseline_%s=%s\n", resultKey(l), f(pred.s.good[0]/bestGood))
		}
	}
}
