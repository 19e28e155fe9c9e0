package bucketserve

import (
	"math"
	"slices"
	"strconv"
	"strings"
)

// Mode is the unit the cut points balance.
type Mode string

// Modes (AIBRIX_BUCKET_SERVE_MODE).
const (
	Throughput Mode = "throughput" // prompt-token mass (default)
	RPS        Mode = "rps"        // request counts
)

// ParseMode reads AIBRIX_BUCKET_SERVE_MODE; an unknown value keeps the default, as the seed says.
func ParseMode(s string) Mode {
	if Mode(s) == RPS {
		return RPS
	}
	return Throughput
}

// Plan limits.
const (
	MaxBands = 16
	// minSharedFraction: a shared range carrying less than 5 % of the traffic is not banded.
	minSharedFraction = 0.05
	// Unlimited is the upper bound of a roleset without a maximum length.
	Unlimited = math.MaxInt32
)

// Group is one eligible roleset: its declared prompt-length range [Min, Max] (inclusive;
// Max = Unlimited when open) and its prefill replica count.
type Group struct {
	Name     string
	Min, Max int
	Replicas int
}

// Band is a prompt-length range [Min, Max] preferred for one roleset.
type Band struct {
	Roleset  string
	Min, Max int
}

// fingerprint identifies a set of groups: name=min-max×replicas, in order.
func fingerprint(mode Mode, groups []Group) string {
	var b strings.Builder
	b.WriteString(string(mode))
	for _, g := range groups {
		b.WriteByte('|')
		b.WriteString(g.Name)
		b.WriteByte('=')
		b.WriteString(strconv.Itoa(g.Min))
		b.WriteByte('-')
		b.WriteString(strconv.Itoa(g.Max))
		b.WriteByte('x')
		b.WriteString(strconv.Itoa(g.Replicas))
	}
	return b.String()
}

// segment is a maximal length range with one covering set of groups.
type segment struct {
	lo, hi int
	cover  []int // group indexes
	weight float64
}

// segments cuts the declared ranges at every bound into maximal intervals with a constant
// covering set; intervals no group covers are dropped.
func segments(groups []Group) []segment {
	var bounds []int
	for _, g := range groups {
		if g.Min > g.Max {
			continue
		}
		bounds = append(bounds, max(g.Min, 0))
		if g.Max < Unlimited {
			bounds = append(bounds, g.Max+1)
		}
	}
	bounds = append(bounds, Unlimited)
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	var out []segment
	for i := 0; i+1 < len(bounds); i++ {
		lo, hi := bounds[i], bounds[i+1]-1
		if i+2 == len(bounds) {
			hi = Unlimited // the last interval includes the open end
		}
		var cover []int
		for gi, g := range groups {
			if g.Min <= g.Max && max(g.Min, 0) <= lo && hi <= g.Max {
				cover = append(cover, gi)
			}
		}
		if len(cover) > 0 {
			out = append(out, segment{lo: lo, hi: hi, cover: cover})
		}
	}
	return out
}

// segWeight sums the bins whose center lies in [lo, hi].
func segWeight(vec *[Bins]float64, lo, hi int) float64 {
	var w float64
	for b := range vec {
		if c := Center(b); c >= lo && c <= hi {
			w += vec[b]
		}
	}
	return w
}

// computeBands is the plan: exclusive traffic charged per roleset, need = replica-share
// target − exclusive, and each shared segment (≥ 2 rolesets, ≥ 5 % of traffic), heaviest
// first, split among the covering rolesets that still need traffic, in proportion to that
// need, at traffic quantiles; each band's traffic is then debited from its roleset's need, so
// a roleset carrying several overlaps draws on one share. At most MaxBands bands.
func computeBands(vec *[Bins]float64, groups []Group) []Band {
	segs := segments(groups)
	var total float64
	for i := range segs {
		segs[i].weight = segWeight(vec, segs[i].lo, segs[i].hi)
		total += segs[i].weight
	}
	if total <= 0 {
		return nil
	}
	exclusive := make([]float64, len(groups))
	var replicas float64
	for _, g := range groups {
		replicas += float64(max(g.Replicas, 0))
	}
	if replicas <= 0 {
		return nil
	}
	for _, s := range segs {
		if len(s.cover) == 1 {
			exclusive[s.cover[0]] += s.weight
		}
	}
	need := make([]float64, len(groups))
	for gi, g := range groups {
		need[gi] = math.Max(0, total*float64(max(g.Replicas, 0))/replicas-exclusive[gi])
	}
	var shared []segment
	for _, s := range segs {
		if len(s.cover) >= 2 && s.weight/total >= minSharedFraction {
			shared = append(shared, s)
		}
	}
	slices.SortStableFunc(shared, func(a, b segment) int {
		switch {
		case a.weight > b.weight:
			return -1
		case a.weight < b.weight:
			return 1
		}
		return a.lo - b.lo
	})
	var bands []Band
	budget := MaxBands
	for _, s := range shared {
		var active []int
		for _, gi := range s.cover {
			if need[gi] > 0 {
				active = append(active, gi)
			}
		}
		slices.SortStableFunc(active, func(a, b int) int {
			switch {
			case need[a] > need[b]:
				return -1
			case need[a] < need[b]:
				return 1
			}
			return strings.Compare(groups[a].Name, groups[b].Name)
		})
		parts := min(len(active), budget)
		if parts == 0 || (parts == 1 && len(active) > 1) {
			continue // nobody needs it, or the budget cannot split it: every roleset stays a candidate
		}
		if parts == 1 {
			g := active[0]
			bands = append(bands, Band{groups[g].Name, s.lo, s.hi})
			need[g] = math.Max(0, need[g]-s.weight)
			budget--
			continue
		}
		shares := make([]float64, parts)
		for i := range shares {
			shares[i] = need[active[i]]
		}
		cuts, ok := cutPoints(vec, s.lo, s.hi, shares)
		if !ok {
			continue
		}
		lo := s.lo
		for i := range parts {
			hi := s.hi
			if i < len(cuts) {
				hi = cuts[i] - 1
			}
			g := active[i]
			bands = append(bands, Band{groups[g].Name, lo, hi})
			need[g] = math.Max(0, need[g]-segWeight(vec, lo, hi))
			lo = hi + 1
		}
		budget -= parts
	}
	slices.SortFunc(bands, func(a, b Band) int { return a.Min - b.Min })
	return bands
}

// cutPoints places len(shares)−1 cuts in [lo, hi]: cut i is the lower edge of the bin after
// the first bin whose running traffic (bins with centers in the segment, ascending) reaches
// total·Σ_{j≤i} share_j / Σ share. A cut outside [lo+1, hi] falls back to the even split
// lo + width·(i+1)/k. Cuts are made strictly increasing; if they still do not fit, the
// segment is kept whole (ok = false).
func cutPoints(vec *[Bins]float64, lo, hi int, shares []float64) ([]int, bool) {
	k := len(shares)
	var sumShare float64
	for _, s := range shares {
		sumShare += s
	}
	segTotal := segWeight(vec, lo, hi)
	width := float64(hi) - float64(lo) + 1
	cuts := make([]int, 0, k-1)
	var acc, target float64
	b := 0
	for i := range k - 1 {
		target += shares[i]
		want := segTotal * target / sumShare
		cut := -1
		for ; b < Bins; b++ {
			c := Center(b)
			if c < lo || c > hi {
				continue
			}
			acc += vec[b]
			if acc >= want && vec[b] > 0 {
				cut = lowerEdge(b + 1)
				b++
				break
			}
		}
		if cut < lo+1 || cut > hi {
			cut = lo + int(width*float64(i+1)/float64(k))
		}
		cuts = append(cuts, cut)
	}
	slices.Sort(cuts)
	for i := 1; i < len(cuts); i++ {
		if cuts[i] <= cuts[i-1] {
			cuts[i] = cuts[i-1] + 1
		}
	}
	if len(cuts) > 0 && (cuts[0] < lo+1 || cuts[len(cuts)-1] > hi) {
		return nil, false
	}
	return cuts, true
}
