package pd

import (
	"slices"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// StepPairMatchUnpaired is the trace step of a pick that found PD candidates the pair-match
// labels left without a pair (Trace.Unpaired names them): during a rolling update, pods
// whose revision has no pod of the other role yet.
const StepPairMatchUnpaired = "pair_match_unpaired"

// maxTracedUnpaired bounds Trace.Unpaired.
const maxTracedUnpaired = 8

// traceUnpaired adds StepPairMatchUnpaired and the pods to tr when the pair-match labels
// leave any of cands unpaired. Only called when a roleset is incomplete: that is rare
// outside a rollout.
func traceUnpaired(tr *picker.Trace, cands []*pool.Endpoint) {
	split := pool.SplitByMatch(pool.Rolesets(cands))
	if len(split) == 0 || tr == nil {
		return
	}
	tr.Add(StepPairMatchUnpaired)
	tr.Unpaired = map[string]string{}
	for _, g := range split {
		for _, e := range slices.Concat(g.Prefill, g.Decode) {
			if len(tr.Unpaired) < maxTracedUnpaired {
				tr.Unpaired[e.Key()] = e.RolesetKey()
			}
		}
	}
}

// llm-d role values that mean "runs both phases".
var llmdCombinedRoles = map[string]bool{"prefill-decode": true, "both": true}

// Roleset is one group of prefill and decode pods sharing a roleset identity
// (pool.Endpoint.RolesetKey): a roleset-name and the values of the pair-match labels, so a
// roleset in a rolling update is one Roleset per revision. Pods without the label form the
// implicit roleset "" (llm-d pools have no rolesets: any prefill pod pairs with any decode
// pod of its revision). Name is the identity.
type Roleset struct {
	Name    string
	Prefill []*pool.Endpoint
	Decode  []*pool.Endpoint
}

// partition is a request's candidates sorted into rolesets and combined pods.
type partition struct {
	rolesets []Roleset // complete rolesets only, in first-seen order
	// prefill and decode are every complete roleset's pods of one side, in roleset order:
	// the rolesets' Prefill and Decode are windows of them.
	prefill, decode []*pool.Endpoint
	combined        []*pool.Endpoint
	// incomplete counts the rolesets skipped for missing a side; nPrefill/nDecode count
	// the PD pods seen at all (for error messages).
	incomplete, nPrefill, nDecode int
	// bucketed is true when bucketing removed or kept rolesets by prompt length.
	bucketed bool
}

// isCombined says whether a standard pod may serve a PD request whole: its routingConfig
// says combined: true, or llm-d labels it prefill-decode/both.
func isCombined(e *pool.Endpoint, rc config.RoutingConfig) bool {
	if rc.Combined {
		return true
	}
	key, v := pool.RoleLabel(e.Labels)
	return key == pool.LabelLLMDRole && llmdCombinedRoles[v]
}

// partitionOf groups the candidates into rolesets from the pods the prefill and decode
// profiles' filters kept (prefill, decode, in candidate order). A roleset exists when any
// candidate carries its name with a PD role, in first-seen order; it is complete, and
// kept, when both sides kept a pod. combined are the combined profile's pods.
func partitionOf(cands, prefill, decode, combined []*pool.Endpoint, bucketed bool) partition {
	var ix rolesetIndex
	ix.init(len(cands))
	pi, di := 0, 0
	for i, e := range cands {
		// The filters keep candidate order, so each list is walked once alongside.
		inPrefill := pi < len(prefill) && prefill[pi] == e
		if inPrefill {
			pi++
		}
		inDecode := di < len(decode) && decode[di] == e
		if inDecode {
			di++
		}
		ix.add(i, e, inPrefill, inDecode)
	}
	return ix.partition(cands, combined, bucketed)
}

// rolesetIndex is the first pass of a partition: each PD candidate's roleset, and the side
// its profile's filters kept it on.
type rolesetIndex struct {
	idx    map[string]int
	counts []struct{ prefill, decode int }
	names  []string
	// slot is each candidate's roleset index, as 2·index for a prefill member and
	// 2·index+1 for a decode member; -1 for pods on no side.
	slot              []int32
	nPrefill, nDecode int
	// last is the roleset index of the previous PD candidate: candidates of one roleset
	// usually come together, so most need no map lookup.
	last int
}

func (ix *rolesetIndex) init(n int) {
	// Rolesets are usually 2 prefill + 2 decode pods: room for n/4 of them up front.
	ix.idx = make(map[string]int, n/4+1)
	ix.counts = make([]struct{ prefill, decode int }, 0, n/4+1)
	ix.names = make([]string, 0, n/4+1)
	ix.slot = make([]int32, n)
	ix.last = -1
}

// add records candidate i; inPrefill and inDecode say which profile kept it.
func (ix *rolesetIndex) add(i int, e *pool.Endpoint, inPrefill, inDecode bool) {
	ix.slot[i] = -1
	if e.Role != pool.RolePrefill && e.Role != pool.RoleDecode {
		return
	}
	if e.Role == pool.RolePrefill {
		ix.nPrefill++
	} else {
		ix.nDecode++
	}
	r, key := ix.last, e.RolesetKey()
	if r < 0 || ix.names[r] != key {
		var ok bool
		if r, ok = ix.idx[key]; !ok {
			r = len(ix.counts)
			ix.idx[key] = r
			ix.counts = append(ix.counts, struct{ prefill, decode int }{})
			ix.names = append(ix.names, key)
		}
		ix.last = r
	}
	switch {
	case inPrefill:
		ix.slot[i] = int32(2 * r)
		ix.counts[r].prefill++
	case inDecode:
		ix.slot[i] = int32(2*r + 1)
		ix.counts[r].decode++
	}
}

// partition is the second pass: complete rolesets only, in first-seen order, laid out in
// one backing array, every prefill pod first, then every decode pod.
func (ix *rolesetIndex) partition(cands, combined []*pool.Endpoint, bucketed bool) partition {
	pt := partition{combined: combined, bucketed: bucketed, nPrefill: ix.nPrefill, nDecode: ix.nDecode}
	pos := make([]int, len(ix.counts)) // index into pt.rolesets, -1 when incomplete
	pt.rolesets = make([]Roleset, 0, len(ix.counts))
	total := 0
	for r, c := range ix.counts {
		pos[r] = -1
		if c.prefill > 0 && c.decode > 0 {
			pos[r] = len(pt.rolesets)
			pt.rolesets = append(pt.rolesets, Roleset{Name: ix.names[r]})
			total += c.prefill + c.decode
		} else {
			pt.incomplete++
		}
	}
	nPre := 0
	for r, c := range ix.counts {
		if pos[r] >= 0 {
			nPre += c.prefill
		}
	}
	backing := make([]*pool.Endpoint, total)
	pt.prefill, pt.decode = backing[:nPre:nPre], backing[nPre:]
	p, d := 0, 0
	for r, c := range ix.counts {
		if i := pos[r]; i >= 0 {
			rs := &pt.rolesets[i]
			rs.Prefill = pt.prefill[p : p : p+c.prefill]
			rs.Decode = pt.decode[d : d : d+c.decode]
			p, d = p+c.prefill, d+c.decode
		}
	}
	for i, e := range cands {
		slot := ix.slot[i]
		if slot < 0 || pos[slot/2] < 0 {
			continue
		}
		rs := &pt.rolesets[pos[slot/2]]
		if slot%2 == 0 {
			rs.Prefill = append(rs.Prefill, e)
		} else {
			rs.Decode = append(rs.Decode, e)
		}
	}
	return pt
}
