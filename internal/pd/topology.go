package pd

import (
	"math"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Topology-aware pairing (TANDEM_TOPOLOGY_LABELS): a soft preference for a prefill and a
// decode pod close to each other, never a filter. When the candidates' topology labels differ
// (some pairs are nearer than others), step 5 weighs pairs rather than each side's best pod:
// per roleset the nearPairWidth cheapest pods of each side, every pair of them, the cheapest
// pair winning and, among pairs of equal cost, the nearest; then the roleset of the cheapest
// pair, the nearest among equals. Under pd-predictive a pair's cost adds what the decode pod
// learned its hand-over from a pod at that distance costs beyond its average (latency's
// TransferShift). When every pair is equally near (no labels, or the same everywhere) step 5
// runs as without it, so those decisions do not change.

// StepPairDistance is the trace step naming the chosen pair's distance class:
// "pair_distance:<class>", 0 for the nearest label.
const StepPairDistance = "pair_distance"

// nearPairWidth is how many of a roleset's cheapest pods per side are paired with each other
// under topology: of ties wider than this, a random draw of nearPairWidth is kept.
const nearPairWidth = 8

// tieTolerance is the relative difference under which two pair costs tie.
const tieTolerance = 1e-9

func ties(a, lo float64) bool { return a <= lo+tieTolerance*max(1, math.Abs(lo)) }

// topologyOf is the request's topology labels when its candidates' placements differ, else
// the zero labels (off for this pick).
func (h *RolesetHandler) topologyOf(s *selection) config.TopologyLabels {
	t := s.knobs.Topology
	if t.Len() == 0 {
		return t
	}
	var varies bool
	if ss := s.split.sorted; ss != nil && ss.snap != nil && s.pt.prefill != nil && sameSlice(s.pt.prefill, ss.pt.prefill) {
		varies = ss.topologyVaries(t)
	} else {
		varies = placementsVary(t, s.pt.prefill, s.pt.decode)
	}
	if !varies {
		return config.TopologyLabels{}
	}
	return t
}

// topologyMemo is whether a snapshot's PD pods' placements differ under some labels.
type topologyMemo struct {
	labels config.TopologyLabels
	varies bool
}

// topologyVaries is placementsVary over the sorting's PD pods, computed once per labels.
func (ss *sortedRoles) topologyVaries(t config.TopologyLabels) bool {
	if m := ss.topo.Load(); m != nil && m.labels == t {
		return m.varies
	}
	m := &topologyMemo{labels: t, varies: placementsVary(t, ss.prefill, ss.decode)}
	ss.topo.Store(m)
	return m.varies
}

// placementsVary reports whether two of the pods differ in a topology label's value (a pod
// without the label differs from one with it): only then are some pairs nearer than others.
func placementsVary(t config.TopologyLabels, sides ...[]*pool.Endpoint) bool {
	var ref config.Placement
	seen := false
	for _, eps := range sides {
		for _, e := range eps {
			p := t.Place(e.Labels)
			if !seen {
				ref, seen = p, true
			} else if p != ref {
				return true
			}
		}
	}
	return false
}

// nearPair is one pair of the topology-aware step 5: indexes into the batches, its cost and
// distance class.
type nearPair struct {
	p, d int
	cost float64
	dist int
}

// pairNear is step 5 under topology: the cheapest pair per roleset, the nearest among equal
// costs, then the roleset of the cheapest, the nearest among equals. It rewrites s.bestP and
// s.bestD (and their scores) to each roleset's pair, and returns the roleset (-1: none) and
// every roleset's final cost.
func (h *RolesetHandler) pairNear(s *selection, t config.TopologyLabels, maxP, maxD float64) (int, []rolesetFinal) {
	nRS := len(s.pt.rolesets)
	byP := make([][]int, nRS)
	byD := make([][]int, nRS)
	for i, r := range s.preRS {
		if !math.IsNaN(s.prefCost[i]) {
			byP[r] = append(byP[r], i)
		}
	}
	for j, r := range s.decRS {
		if !math.IsNaN(s.decCost[j]) {
			byD[r] = append(byD[r], j)
		}
	}
	cheapest := func(ix []int, cost []float64) []int {
		if len(ix) > nearPairWidth {
			// Shuffled first, so the pods kept among more than nearPairWidth tied ones are a
			// random draw, not always the first in pod order.
			for k := len(ix) - 1; k > 0; k-- {
				m := h.c.rand(k + 1)
				ix[k], ix[m] = ix[m], ix[k]
			}
		}
		slices.SortStableFunc(ix, func(a, b int) int {
			switch {
			case cost[a] < cost[b]:
				return -1
			case cost[a] > cost[b]:
				return 1
			}
			return 0
		})
		return ix[:min(len(ix), nearPairWidth)]
	}
	best := make([]nearPair, 0, nRS)
	bestRS := make([]int, 0, nRS)
	pairs := make([]nearPair, 0, nearPairWidth*nearPairWidth)
	places := make([]config.Placement, 0, nearPairWidth) // of a roleset's decode pods
	for r := 0; r < nRS; r++ {
		if len(byP[r]) == 0 || len(byD[r]) == 0 {
			continue
		}
		pairs = pairs[:0]
		ps, ds := cheapest(byP[r], s.prefCost), cheapest(byD[r], s.decCost)
		places = places[:0]
		for _, j := range ds {
			places = append(places, t.Place(s.b.Pods[j].Endpoint.Labels))
		}
		for _, i := range ps {
			pp := t.Place(s.pb.Pods[i].Endpoint.Labels)
			for k, j := range ds {
				np := nearPair{p: i, d: j, dist: t.Between(pp, places[k])}
				np.cost = s.prefCost[i]/maxP + s.decCost[j]/maxD + h.transferShift(s, j, np.dist)
				if math.IsNaN(np.cost) {
					np.cost = math.Inf(1)
				}
				pairs = append(pairs, np)
			}
		}
		k := h.nearest(pairs)
		best, bestRS = append(best, pairs[k]), append(bestRS, r)
		np := pairs[k]
		s.bestP[r], s.scoreP[r], s.bestD[r], s.scoreD[r] = np.p, s.prefCost[np.p], np.d, s.decCost[np.d]
	}
	finals := make([]rolesetFinal, len(best))
	for k, np := range best {
		finals[k] = rolesetFinal{bestRS[k], np.cost}
	}
	if len(best) == 0 {
		return -1, finals
	}
	k := h.nearest(best)
	s.pairDist = best[k].dist
	return bestRS[k], finals
}

// nearest is the index of the cheapest pair, the nearest among those that tie with it,
// random among equally near ones (pairs is not empty; no cost is NaN).
func (h *RolesetHandler) nearest(pairs []nearPair) int {
	lo := math.Inf(1)
	for _, np := range pairs {
		lo = min(lo, np.cost)
	}
	pick, seen, near := 0, 0, math.MaxInt
	for k, np := range pairs {
		if !ties(np.cost, lo) {
			continue
		}
		switch {
		case np.dist < near:
			pick, seen, near = k, 1, np.dist
		case np.dist == near:
			seen++
			if h.c.rand(seen) == 0 {
				pick = k
			}
		}
	}
	return pick
}

// transferShift is, under pd-predictive, what decode pod j's learned hand-over from a pod at
// distance dist costs beyond its average, in the pair's cost units; else 0.
func (h *RolesetHandler) transferShift(s *selection, j, dist int) float64 {
	if !s.absolute || h.c.models == nil || s.b.fc == nil || !s.b.fc[j].Valid() {
		return 0
	}
	return s.b.fc[j].TransferShift(s.promptTokens, dist) / ttftOf(s.obj)
}

// traceDistance names the chosen pair's distance class in the trace.
func traceDistance(s *selection) {
	if s.topo.Len() > 0 {
		s.trace.Add(StepPairDistance + ":" + strconv.Itoa(s.pairDist))
	}
}

// snapshotTopology is the per-snapshot memo a sorting keeps.
type snapshotTopology = atomic.Pointer[topologyMemo]

// nearestTied is the prefill profile's ranking with, under topology, the prefill pod nearest
// to the decode pick first among those that tie with its pick (llm-d's disagg handler picks
// each side on its own: topology only breaks the prefill side's tie). The ranking is
// returned as it is when nothing ties or every candidate is equally near.
func nearestTied(t config.TopologyLabels, pr *picker.ProfileResult, decode *pool.Endpoint) []*pool.Endpoint {
	if t.Len() == 0 || len(pr.Scored) < 2 || len(pr.Ranked) == 0 {
		return pr.Ranked
	}
	top := math.NaN()
	for _, se := range pr.Scored {
		if se.Endpoint == pr.Ranked[0] {
			top = se.Score
		}
	}
	best, bestDist := pr.Ranked[0], t.Distance(pr.Ranked[0].Labels, decode.Labels)
	for _, se := range pr.Scored {
		if se.Score != top || se.Endpoint == best {
			continue
		}
		if dist := t.Distance(se.Endpoint.Labels, decode.Labels); dist < bestDist {
			best, bestDist = se.Endpoint, dist
		}
	}
	if best == pr.Ranked[0] {
		return pr.Ranked
	}
	out := make([]*pool.Endpoint, 0, len(pr.Ranked))
	out = append(out, best)
	for _, e := range pr.Ranked {
		if e != best {
			out = append(out, e)
		}
	}
	return out
}
