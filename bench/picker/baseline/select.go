package baseline

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// selectLocked runs steps 0b–5 under selectMu and registers the chosen pair's load.
func (c *Cascade) selectLocked(cy *picker.Cycle, s *selection) (*picker.Decision, error) {
	k := s.knobs
	pt := &s.pt

	// Step 0b: a bucket match exists, but PD is saturated and a combined pod is idle.
	if pt.bucketed && len(pt.combined) > 0 && c.shouldPickCombined(s) {
		return c.combinedDecision(s, StepCombinedOverflow, c.rankCombined(s, pt.combined)), nil
	}

	// The prefill and decode candidates, each with its roleset index.
	nPre, nDec := 0, 0
	for ri := range pt.rolesets {
		nPre += len(pt.rolesets[ri].prefill)
		nDec += len(pt.rolesets[ri].decode)
	}
	pre := make([]PrefillPod, 0, nPre)
	preRS := make([]int, 0, nPre)
	decEPs := make([]*pool.Endpoint, 0, nDec)
	decRS := make([]int, 0, nDec)
	for ri := range pt.rolesets {
		rs := &pt.rolesets[ri]
		for _, e := range rs.prefill {
			pre = append(pre, PrefillPod{Endpoint: e, Roleset: rs.name, InFlight: float64(c.prefill.InFlight(e.Key())),
				MatchPct: s.match[e.Key()]})
			preRS = append(preRS, ri)
		}
		for _, e := range rs.decode {
			decEPs = append(decEPs, e)
			decRS = append(decRS, ri)
		}
	}

	// Step 1: prefill load imbalance (strict >): the least-loaded prefill pod, at random
	// among equals; decode candidates narrowed to its roleset.
	if i := c.prefillImbalance(pre, k.PrefillLoadImbalanceMinSpread); i >= 0 {
		ri := preRS[i]
		pre, preRS = pre[i:i+1], preRS[i:i+1]
		decEPs, decRS = keepRoleset(decEPs, decRS, ri)
		s.fastSteps = append(s.fastSteps, StepPrefillImbalance)
		s.trace.Add(StepPrefillImbalance)
	}

	// Step 2: decode load imbalance: three ordered checks over the same pass.
	b := c.decodeBatch(cy, s, decEPs, decRS)
	if s.decPol.FastPath() {
		if i, step := c.decodeImbalance(b); i >= 0 {
			ri := decRS[i]
			b.Pods, decRS = b.Pods[i:i+1], decRS[i:i+1]
			if p, r := keepRoleset(pre, preRS, ri); len(p) > 0 {
				pre, preRS = p, r
			}
			s.fastSteps = append(s.fastSteps, step)
			s.trace.Add(step)
		}
	}

	// Step 2b: adaptive bucket serving may prefer one roleset still holding both sides.
	if c.prefer != nil && k.BucketServe && k.PromptLengthBucketing {
		if ri, ok := c.preferred(cy, s, preRS, decRS); ok {
			pre, preRS = keepRoleset(pre, preRS, ri)
			b.Pods, decRS = keepRoleset(b.Pods, decRS, ri)
			s.fastSteps = append(s.fastSteps, StepBucketServe)
			s.trace.Add(StepBucketServe)
		}
	}

	// Steps 3–5: score both sides, best pod per roleset, then the best pair.
	s.trace.Add("prefill_score:" + s.prefPol.Name())
	s.trace.Add("decode_score:" + s.decPol.Name())
	pb := &PrefillBatch{Pods: pre, MaxInFlight: 1, PromptTokens: cy.Req.PromptTokens, Knobs: k,
		TokenizedLen: len(picker.PrefixText(cy))}
	for _, p := range pre {
		pb.MaxInFlight = math.Max(pb.MaxInFlight, p.InFlight)
	}
	nRS := len(pt.rolesets)
	ri, bestP, scoreP, bestD, scoreD, finals, ignored := c.scoreAndPair(s.prefPol, pb, preRS, s.decPol, b, decRS, nRS)
	if ignored {
		s.trace.Add("stddev_skip_ignored")
	}
	if ri < 0 {
		return nil, apierror.Unavailable("no_pd_pair", "no roleset kept both a prefill and a decode candidate after scoring (%d rolesets)", nRS)
	}
	pp, dp := &pre[bestP[ri]], &b.Pods[bestD[ri]]
	s.trace.Add(StepPair)
	if c.afterScoring != nil {
		c.afterScoring()
	}

	d := &picker.Decision{Outcome: picker.OutcomePD, Step: StepPair, Trace: s.trace,
		SetHeaders: map[string]string{HeaderPrefillerHostPort: pp.Endpoint.HostPort()}}
	if len(s.fastSteps) > 0 {
		d.Step = strings.Join(s.fastSteps, stepSeparator)
	}
	lc := newPairLifecycle(c, pp.Endpoint, dp.Endpoint)
	if ch, ok := s.prefPol.(Charger); ok {
		lc.charge(ch.Charge(cy.Req, pp.Endpoint, dp.Endpoint))
	}
	if ch, ok := s.decPol.(Charger); ok {
		lc.charge(ch.Charge(cy.Req, pp.Endpoint, dp.Endpoint))
	}
	d.Lifecycle = lc
	d.Destination = c.withFallbacks(dp.Endpoint, pt.rolesets[ri].decode, func(e *pool.Endpoint) int64 {
		return c.deps.Running.InFlight(e.Key()) + c.pending.InFlight(e.Key())
	})
	lc.dest = d.Destination
	d.Prefill = c.withFallbacks(pp.Endpoint, pt.rolesets[ri].prefill, func(e *pool.Endpoint) int64 {
		return c.prefill.InFlight(e.Key())
	})
	s.trace.Scores = traceScores(pt, finals, pp, scoreP[ri], dp, scoreD[ri])
	return d, nil
}

// scoreAndPair runs step 3 (prefill scoring with the standard-deviation skip), step 4
// (decode scoring) and step 5 (pair). When the skip leaves no roleset with both sides (the
// seed then fails with "target prefill pod is nil"), the prefill side is scored again
// without the skip, so the skip can demote overloaded pods but never fail a request.
func (c *Cascade) scoreAndPair(pp PrefillPolicy, pb *PrefillBatch, preRS []int, dp DecodePolicy, b *DecodeBatch, decRS []int, nRS int) (
	ri int, bestP []int, scoreP []float64, bestD []int, scoreD []float64, finals []rolesetFinal, skipIgnored bool) {
	bestP, scoreP, maxP := c.scorePrefill(pp, pb, preRS, nRS, true)
	bestD, scoreD, maxD := c.scoreDecode(b, dp, decRS, nRS)
	ri, finals = c.pair(bestP, scoreP, maxP, bestD, scoreD, maxD)
	if ri < 0 {
		bestP, scoreP, maxP = c.scorePrefill(pp, pb, preRS, nRS, false)
		ri, finals = c.pair(bestP, scoreP, maxP, bestD, scoreD, maxD)
		skipIgnored = true
	}
	return ri, bestP, scoreP, bestD, scoreD, finals, skipIgnored
}

// prefillImbalance returns the pod to pick when max − min in-flight prefill count exceeds
// spread (strict), choosing at random among the pods at the minimum; -1 otherwise.
func (c *Cascade) prefillImbalance(pre []PrefillPod, spread float64) int {
	if len(pre) < 2 {
		return -1
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range pre {
		lo, hi = math.Min(lo, p.InFlight), math.Max(hi, p.InFlight)
	}
	if !(hi-lo > spread) {
		return -1
	}
	pick, seen := -1, 0
	for i, p := range pre {
		if p.InFlight == lo {
			seen++
			if c.rand(seen) == 0 {
				pick = i
			}
		}
	}
	return pick
}

// decodeBatch reads each decode candidate's signals and the batch maxima.
func (c *Cascade) decodeBatch(cy *picker.Cycle, s *selection, eps []*pool.Endpoint, rs []int) *DecodeBatch {
	b := &DecodeBatch{Pods: make([]DecodePod, len(eps)), MaxRequests: 1, MaxThroughput: 1, MaxFreeGPU: 1, Knobs: s.knobs}
	for i, e := range eps {
		p := &b.Pods[i]
		p.Endpoint, p.Roleset = e, s.pt.rolesets[rs[i]].name
		n, ok := c.deps.Running.Lookup(e.Key())
		p.Running, p.HasRunning = float64(n), ok
		p.Pending = float64(c.pending.InFlight(e.Key()))
		p.FreeGPU = 100
		if smp := c.deps.Metrics.Get(e.Key()); smp != nil {
			p.Sample = smp
			if smp.HasGenThroughput {
				p.Throughput, p.HasThroughput = smp.GenThroughput, true
				b.MaxThroughput = math.Max(b.MaxThroughput, smp.GenThroughput)
			}
			if smp.HasKVUsage {
				p.FreeGPU = math.Round(100 - smp.KVUsage*100)
				if p.FreeGPU <= 0 {
					p.FreeGPU = 0.1
				}
			}
		}
		if c.deps.Drain != nil {
			p.Drain = c.deps.Drain.PerSecond(e.Key())
		}
		b.MaxRequests = math.Max(b.MaxRequests, p.Requests())
		b.MaxFreeGPU = math.Max(b.MaxFreeGPU, p.FreeGPU)
	}
	return b
}

// decodeImbalance runs the three ordered decode checks; the first that fires names the pod.
//  1. running + pending spread ≥ DecodeLoadImbalanceMinSpread among pods with the running
//     metric → the least-loaded of them;
//  2. throughput spread > DecodeThroughputImbalanceMinSpread among pods exporting it →
//     the lowest-throughput pod;
//  3. every pod draining (rate > 0): requests/max(rate, 0.1), max/min ratio >
//     DecodeScoreRatioThreshold (and min > 0) → the lowest ratio.
//
// Pods without a metric are left out of that metric's spread. Ties go at random.
func (c *Cascade) decodeImbalance(b *DecodeBatch) (int, string) {
	k := b.Knobs
	reqMin, reqMax, reqPick, reqSeen := math.Inf(1), math.Inf(-1), -1, 0
	thrMin, thrMax, thrPick, thrSeen := math.Inf(1), math.Inf(-1), -1, 0
	for i := range b.Pods {
		p := &b.Pods[i]
		if p.HasRunning {
			r := p.Requests()
			reqMax = math.Max(reqMax, r)
			reqPick, reqSeen, reqMin = c.minPick(r, reqMin, i, reqPick, reqSeen)
		}
		if p.HasThroughput {
			thrMax = math.Max(thrMax, p.Throughput)
			thrPick, thrSeen, thrMin = c.minPick(p.Throughput, thrMin, i, thrPick, thrSeen)
		}
	}
	if reqPick >= 0 && reqMax-reqMin >= k.DecodeLoadImbalanceMinSpread {
		return reqPick, StepDecodeRequests
	}
	if thrPick >= 0 && thrMax-thrMin > k.DecodeThroughputImbalanceMinSpread {
		return thrPick, StepDecodeThroughput
	}
	scMin, scMax, scPick, scSeen := math.Inf(1), 0.0, -1, 0
	for i := range b.Pods {
		p := &b.Pods[i]
		if !(p.Drain > 0) {
			return -1, ""
		}
		sc := p.Requests() / math.Max(p.Drain, drainRatioFloor)
		scMax = math.Max(scMax, sc)
		scPick, scSeen, scMin = c.minPick(sc, scMin, i, scPick, scSeen)
	}
	if scPick >= 0 && scMin > 0 && scMax/scMin > k.DecodeScoreRatioThreshold {
		return scPick, StepDecodeDrain
	}
	return -1, ""
}

// minPick keeps a running minimum with uniform random choice among ties (reservoir).
func (c *Cascade) minPick(v, lo float64, i, pick, seen int) (int, int, float64) {
	switch {
	case v < lo:
		return i, 1, v
	case v == lo:
		seen++
		if c.rand(seen) == 0 {
			pick = i
		}
		return pick, seen, lo
	}
	return pick, seen, lo
}

// scorePrefill scores the prefill candidates and keeps the lowest per roleset. With skip,
// pods whose in-flight count is above mean + N·(sample std) are left out
// (N = PrefixCache.StandardDeviationFactor; a negative or NaN N disables the skip), and so
// are pods scored NaN. It returns per-roleset best index (-1 none) and score, and max(1, scores).
func (c *Cascade) scorePrefill(pol PrefillPolicy, pb *PrefillBatch, rs []int, nRS int, skip bool) ([]int, []float64, float64) {
	best := make([]int, nRS)
	score := make([]float64, nRS)
	ties := make([]int, nRS)
	for i := range best {
		best[i] = -1
	}
	limit := math.Inf(1)
	if n := pb.Knobs.PrefixCache.StandardDeviationFactor; skip && n >= 0 && len(pb.Pods) > 1 {
		mean, std := meanStd(pb.Pods)
		limit = mean + n*std
	}
	maxScore := 1.0
	for i := range pb.Pods {
		if pb.Pods[i].InFlight > limit {
			continue
		}
		sc := pol.Score(pb, i)
		if math.IsNaN(sc) {
			continue // as on the decode side: a pod its policy cannot score is left out
		}
		c.keepBest(best, score, ties, rs[i], i, sc)
		maxScore = math.Max(maxScore, sc)
	}
	return best, score, maxScore
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

// scoreDecode scores the decode candidates and keeps the lowest per roleset, with the
// seed's cold-start score for pods the gateway never counted while a sibling has metrics,
// and a NaN score rescored once with load_balancing (still NaN: the pod is skipped).
func (c *Cascade) scoreDecode(b *DecodeBatch, pol DecodePolicy, rs []int, nRS int) ([]int, []float64, float64) {
	best := make([]int, nRS)
	score := make([]float64, nRS)
	ties := make([]int, nRS)
	for i := range best {
		best[i] = -1
	}
	anyMetrics := false
	for i := range b.Pods {
		anyMetrics = anyMetrics || b.Pods[i].HasRunning
	}
	maxScore := decodeMaxScoreFloor
	for i := range b.Pods {
		p := &b.Pods[i]
		var sc float64
		if pol.ColdStart() && anyMetrics && !p.HasRunning {
			sc = coldStartBaseScore + p.Pending
		} else {
			sc = pol.Score(b, i)
			if math.IsNaN(sc) && pol.Name() != PolicyLoadBalancing {
				sc = loadBalancingPolicy{}.Score(b, i)
			}
			if math.IsNaN(sc) {
				continue
			}
		}
		c.keepBest(best, score, ties, rs[i], i, sc)
		maxScore = math.Max(maxScore, sc)
	}
	return best, score, maxScore
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
		pick, seen, lo = c.minPick(f, lo, ri, pick, seen)
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

// preferred asks the RolesetPreference among the rolesets with both sides left.
func (c *Cascade) preferred(cy *picker.Cycle, s *selection, preRS, decRS []int) (int, bool) {
	hasP := make([]bool, len(s.pt.rolesets))
	hasD := make([]bool, len(s.pt.rolesets))
	for _, ri := range preRS {
		hasP[ri] = true
	}
	for _, ri := range decRS {
		hasD[ri] = true
	}
	both := make([]string, 0, len(s.pt.rolesets))
	for ri := range s.pt.rolesets {
		if hasP[ri] && hasD[ri] {
			both = append(both, s.pt.rolesets[ri].name)
		}
	}
	name, ok := c.prefer.Prefer(cy, both)
	if !ok || !slices.Contains(both, name) {
		return -1, false
	}
	for ri := range s.pt.rolesets {
		if s.pt.rolesets[ri].name == name {
			return ri, true
		}
	}
	return -1, false
}

// withFallbacks returns primary then up to c.fallbacks other members, least loaded first.
func (c *Cascade) withFallbacks(primary *pool.Endpoint, members []*pool.Endpoint, loadOf func(*pool.Endpoint) int64) []*pool.Endpoint {
	out := make([]*pool.Endpoint, 1, min(len(members), c.fallbacks+1))
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
	return append(out, others[:min(len(others), c.fallbacks)]...)
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
		m["roleset "+pt.rolesets[f.ri].name] = fmt.Sprintf("%.4f", f.score)
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
