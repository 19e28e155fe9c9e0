package pd

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Steps 3–5 of the seed: the lowest cost per roleset on each side, then the roleset with the
// lowest normalised sum. Costs are the policies' raw, lower-is-better units; NaN marks a pod
// that is not a candidate (skipped, or unscorable). Ties go at random, in pod order, so a
// seeded source reproduces a pick.

// stddevLimit is the in-flight count above which step 3 skips a prefill pod: mean + N·(sample
// std) over the batch, N = PrefixCache.StandardDeviationFactor; +Inf (no skip) for a
// negative or NaN N, or a single pod.
func stddevLimit(pods []PrefillPod, n float64) float64 {
	if !(n >= 0) || len(pods) < 2 {
		return math.Inf(1)
	}
	mean, std := meanStd(pods)
	return mean + n*std
}

func meanStd(pods []PrefillPod) (mean, std float64) {
	for _, p := range pods {
		mean += p.InFlight
	}
	mean /= float64(len(pods))
	var ss float64
	for _, p := range pods {
		ss += (p.InFlight - mean) * (p.InFlight - mean)
	}
	return mean, math.Sqrt(ss / float64(len(pods)-1))
}

// decodeCost is pod i's decode cost under pol, with the seed's cold-start score for a pod
// the gateway never counted while a sibling has metrics, and a NaN rescored once with
// load_balancing (still NaN: the pod is left out).
func decodeCost(pol DecodePolicy, b *DecodeBatch, i int, anyMetrics bool) float64 {
	p := &b.Pods[i]
	if pol.ColdStart() && anyMetrics && !p.HasRunning {
		return coldStartBaseScore + p.Pending
	}
	sc := pol.Score(b, i)
	if math.IsNaN(sc) && pol.Name() != PolicyLoadBalancing {
		sc = loadBalancingPolicy{}.Score(b, i)
	}
	return sc
}

// bestOf keeps the lowest cost per roleset (random among equals) and returns, per roleset,
// the best pod's index (-1 none) and cost, and max(floor, costs).
func (c *Cascade) bestOf(costs []float64, rs []int, nRS int, floor float64) ([]int, []float64, float64) {
	best := make([]int, nRS)
	score := make([]float64, nRS)
	ties := make([]int, nRS)
	for i := range best {
		best[i] = -1
	}
	maxScore := floor
	for i, sc := range costs {
		if math.IsNaN(sc) {
			continue
		}
		c.keepBest(best, score, ties, rs[i], i, sc)
		if sc > maxScore { // sc is not NaN: the same as math.Max, without its call
			maxScore = sc
		}
	}
	return best, score, maxScore
}

// scoreAndPair runs step 3 (prefill scoring with the standard-deviation skip), step 4
// (decode scoring) and step 5 (pair) on whole batches. When the skip leaves no roleset with
// both sides (the seed then fails with "target prefill pod is nil"), the prefill side is
// scored again without the skip, so the skip can demote overloaded pods but never fail a
// request. (The chain runs the same steps as profiles; see RolesetHandler.)
func (c *Cascade) scoreAndPair(pp PrefillPolicy, pb *PrefillBatch, preRS []int, dp DecodePolicy, b *DecodeBatch, decRS []int, nRS int) (
	ri int, bestP []int, scoreP []float64, bestD []int, scoreD []float64, finals []rolesetFinal, skipIgnored bool) {
	prefill := func(skip bool) []float64 {
		limit := math.Inf(1)
		if skip {
			limit = stddevLimit(pb.Pods, pb.Knobs.PrefixCache.StandardDeviationFactor)
		}
		costs := make([]float64, len(pb.Pods))
		for i := range pb.Pods {
			costs[i] = math.NaN()
			if pb.Pods[i].InFlight <= limit {
				costs[i] = pp.Score(pb, i)
			}
		}
		return costs
	}
	anyMetrics := slices.ContainsFunc(b.Pods, func(p DecodePod) bool { return p.HasRunning })
	dcost := make([]float64, len(b.Pods))
	for i := range b.Pods {
		dcost[i] = decodeCost(dp, b, i, anyMetrics)
	}
	bestP, scoreP, maxP := c.bestOf(prefill(true), preRS, nRS, 1)
	bestD, scoreD, maxD := c.bestOf(dcost, decRS, nRS, decodeMaxScoreFloor)
	ri, finals = c.pair(bestP, scoreP, maxP, bestD, scoreD, maxD)
	if ri < 0 {
		bestP, scoreP, maxP = c.bestOf(prefill(false), preRS, nRS, 1)
		ri, finals = c.pair(bestP, scoreP, maxP, bestD, scoreD, maxD)
		skipIgnored = true
	}
	return ri, bestP, scoreP, bestD, scoreD, finals, skipIgnored
}

// minPick keeps a running minimum with uniform random choice among ties (reservoir).
func minPick(rnd func(int) int, v, lo float64, i, pick, seen int) (int, int, float64) {
	switch {
	case v < lo:
		return i, 1, v
	case v == lo:
		seen++
		if rnd(seen) == 0 {
			pick = i
		}
		return pick, seen, lo
	}
	return pick, seen, lo
}

func (c *Cascade) keepBest(best []int, score []float64, ties []int, r, i int, sc float64) {
	switch {
	case best[r] < 0 || sc < score[r]:
		best[r], score[r], ties[r] = i, sc, 1
	case sc == score[r]:
		ties[r]++
		if c.rand(ties[r]) == 0 {
			best[r] = i
		}
	}
}

type rolesetFinal struct {
	ri    int
	score float64
}

// pair returns the roleset with the lowest normalised sum (random among equals), and
// every roleset's final score.
func (c *Cascade) pair(bestP []int, scoreP []float64, maxP float64, bestD []int, scoreD []float64, maxD float64) (int, []rolesetFinal) {
	pick, seen, lo := -1, 0, math.Inf(1)
	finals := make([]rolesetFinal, 0, len(bestP))
	for ri := range bestP {
		if bestP[ri] < 0 || bestD[ri] < 0 {
			continue
		}
		f := scoreP[ri]/maxP + scoreD[ri]/maxD
		finals = append(finals, rolesetFinal{ri, f})
		pick, seen, lo = minPick(c.rand, f, lo, ri, pick, seen)
	}
	return pick, finals
}

// keepRoleset keeps the items (and their roleset indexes) of roleset ri.
func keepRoleset[T any](xs []T, rs []int, ri int) ([]T, []int) {
	var ox []T
	var ors []int
	for i, r := range rs {
		if r == ri {
			ox, ors = append(ox, xs[i]), append(ors, r)
		}
	}
	return ox, ors
}

// withFallbacks returns primary then up to n other members, least loaded first.
func withFallbacks(n int, primary *pool.Endpoint, members []*pool.Endpoint, loadOf func(*pool.Endpoint) int64) []*pool.Endpoint {
	out := make([]*pool.Endpoint, 1, min(len(members), n+1))
	out[0] = primary
	if len(members) == 1 {
		return out
	}
	others := make([]*pool.Endpoint, 0, len(members)-1)
	for _, e := range members {
		if e != primary {
			others = append(others, e)
		}
	}
	slices.SortStableFunc(others, func(a, b *pool.Endpoint) int {
		la, lb := loadOf(a), loadOf(b)
		switch {
		case la < lb:
			return -1
		case la > lb:
			return 1
		}
		return 0
	})
	return append(out, others[:min(len(others), n)]...)
}

// leastLoaded is withFallbacks for many members: primary, then the n least loaded others in
// member order among equals, each member's load read once (no sort over all of them).
func leastLoaded(n int, primary *pool.Endpoint, members []*pool.Endpoint, loadOf func(*pool.Endpoint) int64) []*pool.Endpoint {
	out := make([]*pool.Endpoint, 1, n+1)
	out[0] = primary
	type cand struct {
		e    *pool.Endpoint
		load int64
	}
	best := make([]cand, 0, n)
	for _, e := range members {
		if e == primary || n == 0 {
			continue
		}
		c := cand{e, loadOf(e)}
		if len(best) < n {
			best = append(best, c)
		} else if c.load < best[n-1].load {
			best[n-1] = c
		} else {
			continue
		}
		for i := len(best) - 1; i > 0 && best[i].load < best[i-1].load; i-- { // keep sorted, stable
			best[i], best[i-1] = best[i-1], best[i]
		}
	}
	for _, c := range best {
		out = append(out, c.e)
	}
	return out
}

// withCombinedFallbacks appends up to n combined pods (the combined profile's: standard pods
// whose bucket covers the prompt), least loaded first, after a pair's decode destinations: the
// gateway's last resort when it cannot connect to any decode pod of the roleset. A prefill-only
// pod is never among them, nor a decode pod of another roleset (its sidecar would pair it with
// this prefill pod). The ext_proc server drops them in the epp hand-off, whose decode body
// carries one prefill leg's transfer fields.
func (c *Cascade) withCombinedFallbacks(dest, combined []*pool.Endpoint, n int) []*pool.Endpoint {
	if n <= 0 || len(combined) == 0 {
		return dest
	}
	ranked := append(make([]*pool.Endpoint, 0, len(combined)), combined...)
	slices.SortStableFunc(ranked, func(a, b *pool.Endpoint) int {
		return cmp.Compare(c.deps.Running.InFlightOf(a), c.deps.Running.InFlightOf(b))
	})
	return append(dest, ranked[:min(len(ranked), n)]...)
}

func traceScores(pt *partition, finals []rolesetFinal, pp *PrefillPod, ps float64, dp *DecodePod, ds float64) map[string]string {
	slices.SortFunc(finals, func(a, b rolesetFinal) int {
		switch {
		case a.score < b.score:
			return -1
		case a.score > b.score:
			return 1
		}
		return 0
	})
	m := make(map[string]string, min(len(finals), maxTracedRolesets)+2)
	m["prefill "+pp.Endpoint.Key()] = fmt.Sprintf("%.4f", ps)
	m["decode "+dp.Endpoint.Key()] = fmt.Sprintf("%.4f", ds)
	for _, f := range finals[:min(len(finals), maxTracedRolesets)] {
		m["roleset "+pt.rolesets[f.ri].Name] = fmt.Sprintf("%.4f", f.score)
	}
	return m
}

func sortBy[T any](xs []T, less func(a, b T) bool) {
	slices.SortFunc(xs, func(a, b T) int {
		switch {
		case less(a, b):
			return -1
		case less(b, a):
			return 1
		}
		return 0
	})
}
