package baseline

import (
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

// llm-d role values that mean "runs both phases".
var llmdCombinedRoles = map[string]bool{"prefill-decode": true, "both": true}

// roleset is one group of prefill and decode pods sharing a roleset-name. Pods without
// the label form the implicit roleset "" (llm-d pools have no rolesets: any prefill pod
// pairs with any decode pod).
type roleset struct {
	name    string
	prefill []*pool.Endpoint
	decode  []*pool.Endpoint
}

// partition is a request's candidates sorted into rolesets and combined pods.
type partition struct {
	rolesets []roleset // complete rolesets only, in first-seen order
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

// partitionCandidates groups the candidates. With bucketing, a pod joins only when its
// declared range covers promptLen, a roleset only when both sides still have a pod, and a
// combined pod only when its range covers the prompt.
func partitionCandidates(cands []*pool.Endpoint, routing func(*pool.Endpoint) config.RoutingConfig, bucketing bool, promptLen int) partition {
	var pt partition
	// Pass 1: give each PD pod its roleset index and count the pods per side, so pass 2
	// can lay every roleset's pods out in one backing array (no per-roleset allocations).
	idx := make(map[string]int, len(cands)/4+1)
	type side struct{ prefill, decode int }
	var counts []side
	var names []string
	slot := make([]int32, len(cands)) // roleset index, -1 for pods left out
	for i, e := range cands {
		slot[i] = -1
		switch e.Role {
		case pool.RolePrefill, pool.RoleDecode:
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
			if bucketing && routing != nil && !routing(e).Covers(promptLen) {
				continue // the roleset exists (so it counts as incomplete), the pod does not join
			}
			slot[i] = int32(r)
			if e.Role == pool.RolePrefill {
				counts[r].prefill++
			} else {
				counts[r].decode++
			}
		default:
			if routing == nil {
				continue
			}
			rc := routing(e)
			if isCombined(e, rc) && (!bucketing || rc.Covers(promptLen)) {
				pt.combined = append(pt.combined, e)
			}
		}
	}
	// Pass 2: complete rolesets only, in first-seen order.
	pos := make([]int, len(counts)) // index into pt.rolesets, -1 when incomplete
	total := 0
	for r, c := range counts {
		pos[r] = -1
		if c.prefill > 0 && c.decode > 0 {
			pos[r] = len(pt.rolesets)
			pt.rolesets = append(pt.rolesets, roleset{name: names[r]})
			total += c.prefill + c.decode
		} else {
			pt.incomplete++
		}
	}
	backing := make([]*pool.Endpoint, 0, total)
	for r, c := range counts {
		if p := pos[r]; p >= 0 {
			rs := &pt.rolesets[p]
			rs.prefill = backing[len(backing) : len(backing) : len(backing)+c.prefill]
			backing = backing[:len(backing)+c.prefill]
			rs.decode = backing[len(backing) : len(backing) : len(backing)+c.decode]
			backing = backing[:len(backing)+c.decode]
		}
	}
	for i, e := range cands {
		if slot[i] < 0 || pos[slot[i]] < 0 {
			continue
		}
		rs := &pt.rolesets[pos[slot[i]]]
		if e.Role == pool.RolePrefill {
			rs.prefill = append(rs.prefill, e)
		} else {
			rs.decode = append(rs.decode, e)
		}
	}
	pt.bucketed = bucketing
	return pt
}
