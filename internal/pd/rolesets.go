package pd

import (
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

// llm-d role values that mean "runs both phases".
var llmdCombinedRoles = map[string]bool{"prefill-decode": true, "both": true}

// Roleset is one group of prefill and decode pods sharing a roleset-name. Pods without the
// label form the implicit roleset "" (llm-d pools have no rolesets: any prefill pod pairs
// with any decode pod).
type Roleset struct {
	Name    string
	Prefill []*pool.Endpoint
	Decode  []*pool.Endpoint
}

// partition is a request's candidates sorted into rolesets and combined pods.
type partition struct {
	rolesets []Roleset // complete rolesets only, in first-seen order
	combined []*pool.Endpoint
	// incomplete counts the rolesets skipped for missing a side; nPrefill/nDecode count
	// the PD pods seen at all (for error messages).
	incomplete, nPrefill, nDecode int
	// bucketed is true when bucketing removed or kept rolesets by prompt length.
	bucketed bool
}

// isCombined says whether a standard pod may serve a PD request whole: its routingConfig
// says combined: true, or llm-d labels it prefill-decode/both.
func isCombined(e *pool.Endpoint, rc config.RoutingConfig) bool {
	return rc.Combined || (e.Labels[pool.LabelRoleName] == "" && llmdCombinedRoles[e.Labels[pool.LabelLLMDRole]])
}

// partitionOf groups the candidates into rolesets from the pods the prefill and decode
// profiles' filters kept (prefill, decode, in candidate order). A roleset exists when any
// candidate carries its name with a PD role, in first-seen order; it is complete, and
// kept, when both sides kept a pod. combined are the combined profile's pods.
func partitionOf(cands, prefill, decode, combined []*pool.Endpoint, bucketed bool) partition {
	pt := partition{combined: combined, bucketed: bucketed}
	// Pass 1: each PD candidate's roleset index; which side the filters kept it on.
	idx := make(map[string]int, len(cands)/4+1)
	type side struct{ prefill, decode int }
	var counts []side
	var names []string
	// slot is each candidate's roleset index, as 2·index for a prefill member and
	// 2·index+1 for a decode member; -1 for pods on no side.
	slot := make([]int32, len(cands))
	pi, di := 0, 0
	for i, e := range cands {
		slot[i] = -1
		// The filters keep candidate order, so each list is walked once alongside.
		inPrefill := pi < len(prefill) && prefill[pi] == e
		if inPrefill {
			pi++
		}
		inDecode := di < len(decode) && decode[di] == e
		if inDecode {
			di++
		}
		if e.Role != pool.RolePrefill && e.Role != pool.RoleDecode {
			continue
		}
		if e.Role == pool.RolePrefill {
			pt.nPrefill++
		} else {
			pt.nDecode++
		}
		r, ok := idx[e.Roleset]
		if !ok {
			r = len(counts)
			idx[e.Roleset] = r
			counts = append(counts, side{})
			names = append(names, e.Roleset)
		}
		switch {
		case inPrefill:
			slot[i] = int32(2 * r)
			counts[r].prefill++
		case inDecode:
			slot[i] = int32(2*r + 1)
			counts[r].decode++
		}
	}
	// Pass 2: complete rolesets only, in first-seen order, laid out in one backing array.
	pos := make([]int, len(counts)) // index into pt.rolesets, -1 when incomplete
	total := 0
	for r, c := range counts {
		pos[r] = -1
		if c.prefill > 0 && c.decode > 0 {
			pos[r] = len(pt.rolesets)
			pt.rolesets = append(pt.rolesets, Roleset{Name: names[r]})
			total += c.prefill + c.decode
		} else {
			pt.incomplete++
		}
	}
	backing := make([]*pool.Endpoint, 0, total)
	for r, c := range counts {
		if p := pos[r]; p >= 0 {
			rs := &pt.rolesets[p]
			rs.Prefill = backing[len(backing) : len(backing) : len(backing)+c.prefill]
			backing = backing[:len(backing)+c.prefill]
			rs.Decode = backing[len(backing) : len(backing) : len(backing)+c.decode]
			backing = backing[:len(backing)+c.decode]
		}
	}
	for i, e := range cands {
		if slot[i] < 0 || pos[slot[i]/2] < 0 {
			continue
		}
		rs := &pt.rolesets[pos[slot[i]/2]]
		if slot[i]%2 == 0 {
			rs.Prefill = append(rs.Prefill, e)
		} else {
			rs.Decode = append(rs.Decode, e)
		}
	}
	return pt
}
