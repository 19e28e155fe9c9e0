package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/tandem-epp/tandem/internal/advisor"
)

// The P:D ratio advisor's check (-check advisor, make bench-advisor): for each workload, the
// SLO-goodput capacity of every split of the first shape's pods between prefill, decode and
// standard pods, measured under pd-predictive; then the advisor's recommendation from a run
// on the shape itself, and how far it is from the best splits.

// splitName is a split as the report writes it: 4p4d2s.
func splitName(s advisor.Split) string {
	return fmt.Sprintf("%dp%dd%ds", s.Prefill, s.Decode, s.Standard)
}

// splitCluster is the shape of a split: one roleset (any prefill pod pairs with any decode
// pod) and the standard pods.
func splitCluster(s advisor.Split) clusterSpec {
	return clusterSpec{name: fmt.Sprintf("1x%dp%dd+%ds", s.Prefill, s.Decode, s.Standard), rolesets: 1,
		prefill: s.Prefill, decode: s.Decode, standard: s.Standard}
}

// splitOf is the split of a shape's pods.
func splitOf(c clusterSpec) advisor.Split {
	return advisor.Split{Prefill: c.rolesets * c.prefill, Decode: c.rolesets * c.decode, Standard: c.standard}
}

// sweep is the measured capacity of every split of a pod count.
type sweep struct {
	splits []advisor.Split
	caps   []float64 // the mean over seeds
	best   float64
}

// bests are the splits whose capacity is within the search's resolution of the best.
func (s *sweep) bests() []advisor.Split {
	var out []advisor.Split
	for i, c := range s.caps {
		if c*capTolerance >= s.best {
			out = append(out, s.splits[i])
		}
	}
	return out
}

// capacityOf is the measured capacity of t (NaN when the sweep did not run it).
func (s *sweep) capacityOf(t advisor.Split) float64 {
	if i := slices.Index(s.splits, t); i >= 0 {
		return s.caps[i]
	}
	return math.NaN()
}

// sweepSplits searches the capacity of every split of n pods under pol for each seed,
// starting each search from guess, and keeps the mean over the seeds.
func sweepSplits(o *options, w *workload, n int, pol policy, guess float64, seeds int) (*sweep, error) {
	s := &sweep{splits: advisor.Splits(n)}
	caps := make([]float64, len(s.splits)*seeds)
	err := parallel(len(caps), o.workers, func(i int) error {
		c, seed := splitCluster(s.splits[i/seeds]), o.seed+uint64(i%seeds)
		cp, err := sloCapacity(o, w, c, pol, seed, guess)
		caps[i] = cp
		return err
	})
	if err != nil {
		return nil, err
	}
	s.caps = make([]float64, len(s.splits))
	for i := range caps {
		s.caps[i/seeds] += caps[i] / float64(seeds)
	}
	s.best = slices.Max(s.caps)
	return s, nil
}

// sloCapacity is the SLO-goodput capacity of w on c under pol with the given seed, searched
// from guess.
func sloCapacity(o *options, w *workload, c clusterSpec, pol policy, seed uint64, guess float64) (float64, error) {
	cp, _, err := searchCapacity(guess, func(rate float64) (bool, error) {
		res, err := simulate(w, c, pol, runOpts{params: o.params, scrape: o.scrape, seed: seed, rate: rate})
		if err != nil {
			return false, err
		}
		sm, _ := summarize(res)
		return sm.sloPct >= goodFraction, nil
	})
	return cp, err
}

// nearest is how many pods must change role to turn s into the nearest of bests.
func nearest(s advisor.Split, bests []advisor.Split) int {
	n := math.MaxInt
	for _, b := range bests {
		n = min(n, s.Moves(b))
	}
	return n
}

// adviceLoad is the share of the shape's measured capacity the advisor's run offers.
const adviceLoad = 0.7

// checkAdvisor runs the advisor's check and prints its RESULT lines.
func checkAdvisor(o *options, dataDir string, stdout io.Writer) error {
	c := o.clusters[0]
	cur := splitOf(c)
	pol := allPolicies[slices.IndexFunc(allPolicies, func(p policy) bool { return p.name == "pd-predictive" })]
	for _, wn := range o.workloads {
		tr, err := readTrace(dataDir, wn)
		if err != nil {
			return err
		}
		w, err := tr.window(o.requests[wn], 0, o.params, o.seed, o.slo)
		if err != nil {
			return err
		}
		guess, err := capacity(w, c, o)
		if err != nil {
			return err
		}
		sw, err := sweepSplits(o, w, cur.Pods(), pol, guess, o.seeds)
		if err != nil {
			return err
		}
		// The advisor, from a run on the shape itself at adviceLoad of its capacity.
		shapeCap, err := sloCapacity(o, w, c, pol, o.seed, guess)
		if err != nil {
			return err
		}
		res, err := simulate(w, c, pol, runOpts{params: o.params, scrape: o.scrape, seed: o.seed, rate: adviceLoad * shapeCap, advise: adviseEvery})
		if err != nil {
			return err
		}
		if len(res.advice) == 0 || len(res.advice[len(res.advice)-1].rep.Models) != 1 {
			return fmt.Errorf("advisor check of %s: the run gave no advice for its one model", wn)
		}
		ad := res.advice[len(res.advice)-1].rep.Models[0]
		bests := sw.bests()
		errPods := nearest(ad.Recommended, bests)
		ratio := sw.capacityOf(ad.Recommended) / sw.best

		fmt.Fprintf(stdout, "advisor check: %s, %d pods (shape %s: %.1f req/s measured), %d splits × %d seeds, best %.1f req/s\n",
			wn, cur.Pods(), c.name, shapeCap, len(sw.splits), o.seeds, sw.best)
		var cells []string
		for i, s := range sw.splits {
			cells = append(cells, fmt.Sprintf("%s=%.1f", splitName(s), sw.caps[i]))
		}
		fmt.Fprintln(stdout, "  measured: "+strings.Join(cells, " "))
		var bs []string
		for _, b := range bests {
			bs = append(bs, splitName(b))
		}
		fmt.Fprintf(stdout, "  best: %s\n", strings.Join(bs, " "))
		fmt.Fprintf(stdout, "  advice at %.0f%% load (%d requests, confidence %.2f): saturation prefill %.2f decode %.2f standard %.2f (binding %s); "+
			"recommended %s (predicted %.1f req/s; current %.1f), measured %.1f req/s\n",
			adviceLoad*100, ad.Requests, ad.Confidence, ad.Saturation.Prefill, ad.Saturation.Decode, ad.Saturation.Standard, ad.Binding,
			splitName(ad.Recommended), ad.RecommendedCapacity, ad.CurrentCapacity, sw.capacityOf(ad.Recommended))
		var pc []string
		for _, s := range sw.splits {
			pc = append(pc, fmt.Sprintf("%s=%.1f", splitName(s), res.predicted[s]))
		}
		fmt.Fprintln(stdout, "  predicted: "+strings.Join(pc, " "))
		fmt.Fprintf(stdout, "  fits: %+v\n", ad.Fits)
		fmt.Fprintf(stdout, "RESULT pd_advice_error_pods_%s=%d\n", wn, errPods)
		fmt.Fprintf(stdout, "RESULT pd_advice_capacity_ratio_%s=%.3f\n", wn, ratio)
		if wn == shiftWorkload {
			if err := checkShifts(o, tr, c, pol, stdout); err != nil {
				return err
			}
		}
	}
	return nil
}

// shiftWorkload is the workload the shifts are run on.
const shiftWorkload = "conv"

// shifts are the traffic changes the advisor must follow: every prompt, or every output,
// four times longer from the middle of the run on.
var shifts = []struct {
	name           string
	prompt, output int
}{{"prompt4x", 4, 1}, {"output4x", 1, 4}}

// Lengths of the shift run, in virtual seconds: before the shift (the advice settles on the
// old traffic) and after it (long enough for the window to hold only the new traffic and
// for the advice to settle).
const (
	shiftBefore = 120.0
	shiftAfter  = 300.0
	adviseEvery = 5.0
)

// checkShifts runs, for each shift, the workload on the shape at adviceLoad of its capacity
// and then the shifted workload at adviceLoad of its own, asking the advisor every
// adviseEvery seconds; it measures the best splits of the shifted traffic as for the
// workloads, and prints how long after the shift the recommendation came, for good, within
// one pod of one of them (RESULT pd_advice_follow_s_<shift>; -1: it never did).
func checkShifts(o *options, tr *trace, c clusterSpec, pol policy, stdout io.Writer) error {
	before, beforeCap, _, err := shiftPart(o, tr, c, pol, 1, 1, shiftBefore)
	if err != nil {
		return err
	}
	for _, sh := range shifts {
		after, afterCap, win, err := shiftPart(o, tr, c, pol, sh.prompt, sh.output, shiftAfter)
		if err != nil {
			return err
		}
		sw, err := sweepSplits(o, win, splitOf(c).Pods(), pol, afterCap, o.seeds)
		if err != nil {
			return err
		}
		bests := sw.bests()
		// One workload: the old traffic, then the new from shiftBefore on.
		w := &workload{name: tr.name + "-" + sh.name, source: tr.source, span: shiftBefore + shiftAfter}
		for _, part := range []*workload{before, after} {
			for _, q := range part.reqs {
				q.id = len(w.reqs)
				w.reqs = append(w.reqs, q)
			}
		}
		arr := append(before.arrivals(adviceLoad*beforeCap, o.seed), after.arrivals(adviceLoad*afterCap, o.seed+1)...)
		for i := range w.reqs {
			w.reqs[i].at = arr[i]
			if i >= len(before.reqs) {
				w.reqs[i].at += shiftBefore
			}
		}
		res, err := simulate(w, c, pol, runOpts{params: o.params, scrape: o.scrape, seed: o.seed, advise: adviseEvery})
		if err != nil {
			return err
		}
		follow := -1.0
		var seq []string
		var last advisor.Split
		for _, a := range res.advice {
			rec := a.rep.Models[0].Recommended
			if a.at >= shiftBefore && nearest(rec, bests) <= 1 {
				if follow < 0 {
					follow = a.at - shiftBefore
				}
			} else {
				follow = -1
			}
			if rec != last {
				seq = append(seq, fmt.Sprintf("%+.0fs:%s", a.at-shiftBefore, splitName(rec)))
				last = rec
			}
		}
		var bs []string
		for _, b := range bests {
			bs = append(bs, splitName(b))
		}
		fmt.Fprintf(stdout, "advisor shift %s on %s (%s): %.1f req/s before, %.1f after; best splits after (measured, %.1f req/s): %s; advice over time: %s\n",
			sh.name, tr.name, c.name, adviceLoad*beforeCap, adviceLoad*afterCap, sw.best, strings.Join(bs, " "), strings.Join(seq, " "))
		fmt.Fprintf(stdout, "RESULT pd_advice_follow_s_%s=%.0f\n", sh.name, follow)
	}
	return nil
}

// shiftPart is a window of the trace with prompts and outputs scaled, lasting about secs at
// adviceLoad of its capacity on the shape; that capacity; and the window of the usual size
// the capacity was measured on.
func shiftPart(o *options, tr *trace, c clusterSpec, pol policy, prompt, output int, secs float64) (*workload, float64, *workload, error) {
	scaled := &trace{name: tr.name, source: tr.source, reqs: slices.Clone(tr.reqs)}
	for i := range scaled.reqs {
		scaled.reqs[i].prompt *= prompt
		scaled.reqs[i].out *= output
	}
	win, err := scaled.window(o.requests[tr.name], 0, o.params, o.seed, o.slo)
	if err != nil {
		return nil, 0, nil, err
	}
	guess, err := capacity(win, c, o)
	if err != nil {
		return nil, 0, nil, err
	}
	capRate, err := sloCapacity(o, win, c, pol, o.seed, guess)
	if err != nil {
		return nil, 0, nil, err
	}
	w, err := scaled.window(int(math.Ceil(adviceLoad*capRate*secs)), 0, o.params, o.seed, o.slo)
	if err != nil {
		return nil, 0, nil, err
	}
	return w, capRate, win, nil
}
