package pd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// TypeRolesetHandler is the seed's pair-aware profile handler.
const TypeRolesetHandler = "roleset-pd-profile-handler"

type rolesetHandlerParams struct {
	Profiles struct {
		Prefill  string `json:"prefill" default:"prefill" doc:"The profile whose filters choose the prefill candidates and whose one prefill-policy-scorer scores them."`
		Decode   string `json:"decode" default:"decode" doc:"The profile whose filters choose the decode candidates and whose one decode-policy-scorer scores them."`
		Combined string `json:"combined" default:"combined" doc:"The profile whose filters choose the combined pods (fallback and overflow); optional."`
	} `json:"profiles"`
	Deciders struct {
		CombinedOverflow string `json:"combinedOverflow" doc:"A combined-overflow-decider (step 0b); unset: no overflow."`
		PrefillImbalance string `json:"prefillImbalance" doc:"A prefill-imbalance-decider (step 1); unset: no prefill fast path."`
		DecodeImbalance  string `json:"decodeImbalance" doc:"A decode-imbalance-decider (step 2); unset: no decode fast path."`
		Selective        string `json:"selective" doc:"A selective-pd-decider (after step 5): the prompt may run whole on a decode pod when predicted cheaper; unset: always disaggregate."`
		SLOOverflow      string `json:"sloOverflow" doc:"A slo-overflow-decider (after the selective one): a standard pod takes a request PD is predicted to serve too late; unset: no such overflow."`
	} `json:"deciders"`
	Fallbacks *int `json:"fallbacks" default:"2" doc:"Fallbacks after the primary on each side, from the same roleset."`
}

// RolesetHandler is the seed's Pod Selection Algorithm as a profile handler over a prefill,
// a decode and a combined profile:
//
//   - before the critical section (Produce): the request's policies, and its candidates
//     sorted into complete rolesets and combined pods by the profiles' filters (role,
//     prompt-length bucket, and any a config adds);
//   - first round (Next): step 0b (overflow to a combined pod), step 1 (prefill imbalance),
//     step 2 (decode imbalance) and 2b (bucket-serve preference) as its deciders, then the
//     prefill and decode profiles run on what is left (the scoring-only standard-deviation
//     skip, the policy scorers);
//   - second round: the best pod per roleset on each side and the best pair (steps 3–5); if
//     the skip left no pair, the prefill profile runs again without it;
//   - Result: the pair (or the combined pod), fallbacks from the same roleset, the prefill
//     target, the trace; the pick's load is registered before the lock is released.
//
// Non-completion requests go to a non-prefill pod by least-request.
type RolesetHandler struct {
	picker.TypedName
	c                                 *Cascade
	prefillName, decodeName, combName string
	prefill, decode, combined         *picker.Profile
	// prefillScoring and decodeScoring are what the scoring round runs of the prefill and
	// decode profiles: their scoring-only filters and their scorers (the other filters
	// chose the candidates already).
	prefillScoring, decodeScoring *picker.Profile
	prefillScorer, decodeScorer   *PolicyScorer
	overflow                      CombinedOverflow
	prefillFast                   PrefillFastPath
	decodeFast                    DecodeFastPath
	// placement: the deciders that may move the pair's request elsewhere by predicted
	// latency, in order (selective, then SLO overflow).
	placement    []PlacementDecider
	nonInference *picker.Profile
	fallbacks    int
	// bySnapshot is the last snapshot's endpoints sorted by role (see sortedRoles); byView
	// the same for the snapshot's per-model views (pool.Snapshot.OfModel) in a pool of
	// several models.
	bySnapshot atomic.Pointer[sortedRoles]
	byView     atomic.Pointer[viewSorts]
}

// viewSorts are one snapshot's per-model views sorted by role, by the address of the view's
// first element (a view the snapshot owns never changes, nor does its address).
type viewSorts struct {
	snap  *pool.Snapshot
	views map[**pool.Endpoint]*sortedRoles
}

// Profile names of the default chain.
const (
	ProfilePrefill      = "prefill"
	ProfileDecode       = "decode"
	ProfileCombined     = "combined"
	profileNonInference = "non-inference"
)

// NewDefaultChain is the "pd" strategy: the roleset handler with the three deciders over
//
//	prefill:  pd-role-filter(prefill), prompt-length-bucket-filter, prefill-stddev-filter,
//	          prefill-policy-scorer
//	decode:   pd-role-filter(decode), prompt-length-bucket-filter, decode-policy-scorer
//	combined: pd-role-filter(combined), prompt-length-bucket-filter
//
// A --config-file declaring the same plugins builds the same chain.
func (c *Cascade) NewDefaultChain() *picker.Chain {
	h := c.newRolesetHandlerOf("", ProfilePrefill, ProfileDecode, ProfileCombined, c.fallbacks)
	h.overflow = &CombinedOverflowDecider{picker.NewTypedName(TypeCombinedOverflowDecider, ""), c}
	h.prefillFast = &PrefillImbalanceDecider{TypedName: picker.NewTypedName(TypePrefillImbalanceDecider, "")}
	h.decodeFast = &DecodeImbalanceDecider{picker.NewTypedName(TypeDecodeImbalanceDecider, "")}
	profiles := []*picker.Profile{
		{Name: ProfilePrefill, Filters: []picker.Filter{NewRoleFilter(RolePrefill), NewBucketFilter(),
			&StddevFilter{TypedName: picker.NewTypedName(TypeStddevFilter, ""), c: c}},
			Scorers: []picker.WeightedScorer{{Scorer: c.NewPrefillPolicyScorer(""), Weight: 1}}},
		{Name: ProfileDecode, Filters: []picker.Filter{NewRoleFilter(RoleDecode), NewBucketFilter()},
			Scorers: []picker.WeightedScorer{{Scorer: c.NewDecodePolicyScorer(""), Weight: 1}}},
		{Name: ProfileCombined, Filters: []picker.Filter{NewRoleFilter(RoleCombined), NewBucketFilter()}},
	}
	ch, err := picker.NewChain(StrategyName, h, profiles, c.deps)
	if err != nil {
		panic(fmt.Sprintf("pd: the default chain does not bind: %v", err)) // a programming error
	}
	return ch
}

func (c *Cascade) newRolesetHandlerOf(name, prefill, decode, combined string, fallbacks int) *RolesetHandler {
	return &RolesetHandler{TypedName: picker.NewTypedName(TypeRolesetHandler, name), c: c,
		prefillName: prefill, decodeName: decode, combName: combined, fallbacks: fallbacks,
		nonInference: &picker.Profile{Name: profileNonInference, Filters: []picker.Filter{picker.NewDecodeRoleFilter()},
			Scorers: []picker.WeightedScorer{{Scorer: picker.NewLeastRequestScorer(c.deps), Weight: 1}}, Picker: picker.NewMaxScorePicker()}}
}

func (c *Cascade) newRolesetHandler(name string, raw json.RawMessage, h *picker.Handle) (picker.Plugin, error) {
	var p rolesetHandlerParams
	p.Profiles.Prefill, p.Profiles.Decode, p.Profiles.Combined = ProfilePrefill, ProfileDecode, ProfileCombined
	if err := picker.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	fallbacks := defaultFallbacks
	if p.Fallbacks != nil {
		if *p.Fallbacks < 0 {
			return nil, picker.BadParam("fallbacks", *p.Fallbacks, "must be 0 or more")
		}
		fallbacks = *p.Fallbacks
	}
	r := c.newRolesetHandlerOf(name, p.Profiles.Prefill, p.Profiles.Decode, p.Profiles.Combined, fallbacks)
	deciders := []struct {
		field, name string
		set         func(picker.Plugin) bool
	}{
		{"deciders.combinedOverflow", p.Deciders.CombinedOverflow, func(pl picker.Plugin) bool { d, ok := pl.(CombinedOverflow); r.overflow = d; return ok }},
		{"deciders.prefillImbalance", p.Deciders.PrefillImbalance, func(pl picker.Plugin) bool { d, ok := pl.(PrefillFastPath); r.prefillFast = d; return ok }},
		{"deciders.decodeImbalance", p.Deciders.DecodeImbalance, func(pl picker.Plugin) bool { d, ok := pl.(DecodeFastPath); r.decodeFast = d; return ok }},
		{"deciders.selective", p.Deciders.Selective, placementOf(r, TypeSelectiveDecider)},
		{"deciders.sloOverflow", p.Deciders.SLOOverflow, placementOf(r, TypeSLOOverflowDecider)},
	}
	for _, d := range deciders {
		if d.name == "" {
			continue
		}
		pl, err := h.Require(d.name)
		if errors.Is(err, picker.ErrNotBuilt) {
			return nil, err // built again once the decider is
		}
		if err != nil {
			return nil, &picker.ParamError{Field: d.field, Value: d.name, Rule: err.Error()}
		}
		if !d.set(pl) {
			return nil, picker.BadParam(d.field, d.name, "names a "+pl.Type()+", which is not that decider")
		}
	}
	return r, nil
}

// placementOf adds a placement decider of type typ to r.
func placementOf(r *RolesetHandler, typ string) func(picker.Plugin) bool {
	return func(pl picker.Plugin) bool {
		d, ok := pl.(PlacementDecider)
		if ok && pl.Type() == typ {
			r.placement = append(r.placement, d)
			return true
		}
		return false
	}
}

// RanksItself implements picker.RanksItself: the pair is chosen across two profiles.
func (h *RolesetHandler) RanksItself() {}

// CriticalSection implements picker.Exclusive: the cascade's, shared by every PD selection.
func (h *RolesetHandler) CriticalSection() picker.Locker { return h.c.CriticalSection() }

// Bind implements picker.ProfileBinder: the prefill and decode profiles must exist, with
// exactly one policy scorer of their side each (the pair is made on its raw cost).
func (h *RolesetHandler) Bind(profiles []*picker.Profile) error {
	find := func(name string) *picker.Profile {
		for _, p := range profiles {
			if p.Name == name {
				return p
			}
		}
		return nil
	}
	h.prefill, h.decode, h.combined = find(h.prefillName), find(h.decodeName), find(h.combName)
	for _, side := range []struct {
		name    string
		p       *picker.Profile
		typ     string
		scorer  **PolicyScorer
		prefill bool
	}{{h.prefillName, h.prefill, TypePrefillPolicyScorer, &h.prefillScorer, true}, {h.decodeName, h.decode, TypeDecodePolicyScorer, &h.decodeScorer, false}} {
		if side.p == nil {
			return fmt.Errorf("%s needs a scheduling profile named %q (profiles.%s)", TypeRolesetHandler, side.name, map[bool]string{true: "prefill", false: "decode"}[side.prefill])
		}
		if len(side.p.Scorers) != 1 {
			return fmt.Errorf("profile %q: %s pairs on the raw cost of one %s; the profile has %d scorers", side.name, TypeRolesetHandler, side.typ, len(side.p.Scorers))
		}
		ps, ok := side.p.Scorers[0].Scorer.(*PolicyScorer)
		if !ok || ps.prefill != side.prefill {
			return fmt.Errorf("profile %q: %s pairs on the raw cost of one %s; %q is a %s", side.name, TypeRolesetHandler, side.typ,
				side.p.Scorers[0].Scorer.Name(), side.p.Scorers[0].Scorer.Type())
		}
		*side.scorer = ps
	}
	h.prefillScoring, h.decodeScoring = scoringPart(h.prefill), scoringPart(h.decode)
	return nil
}

func scoringPart(p *picker.Profile) *picker.Profile {
	sp := &picker.Profile{Name: p.Name, Scorers: p.Scorers}
	for _, f := range p.Filters {
		if _, ok := f.(interface{ ScoringOnly() }); ok {
			sp.Filters = append(sp.Filters, f)
		}
	}
	return sp
}

// Produce implements picker.DataProducer: everything before the critical section.
func (h *RolesetHandler) Produce(ctx context.Context, cy *picker.Cycle) error {
	c := h.c
	s := &selection{ri: -1}
	selectionKey.Write(cy.State, s)
	if cy.Req.API == request.APIOther {
		s.nonInference = true
		return nil
	}
	s.knobs, s.promptTokens = &cy.Resolved.PD, cy.Req.PromptTokens
	s.trace = &picker.Trace{Candidates: len(cy.Candidates)}
	pol := c.policiesFor(ctx, cy, h.prefillScorer.policy, h.decodeScorer.policy)
	if pol.err != nil {
		return pol.err
	}
	s.prefPol, s.decPol = pol.prefill, pol.decode
	_, absP := s.prefPol.(AbsoluteCost)
	_, absD := s.decPol.(AbsoluteCost)
	s.absolute = absP && absD
	if s.predictive = c.models != nil && (absP || absD || len(h.placement) > 0); s.predictive {
		var err error
		if s.obj, err = c.objectiveOf(cy); err != nil {
			return err
		}
	}
	s.trace.Note = fmt.Sprintf("%sprefill_policy=%s decode_policy=%s prompt_tokens=%d", pol.note, s.prefPol.Name(), s.decPol.Name(), cy.Req.PromptTokens)
	split := &s.split
	prefill := h.candidates(ctx, cy, h.prefill, split)
	decode := h.candidates(ctx, cy, h.decode, split)
	combined := h.candidates(ctx, cy, h.combined, split)
	if split.done && sameSlice(prefill, split.sorted.prefill) && sameSlice(decode, split.sorted.decode) {
		// The profiles kept what the role split sorted (no other filter dropped a pod): the
		// sorting's roleset index is the partition's first pass (its partition, made once,
		// for the snapshot's sorting).
		s.pt = split.sorted.partition(cy.Candidates, combined, s.knobs.PromptLengthBucketing)
	} else {
		s.pt = partitionOf(cy.Candidates, prefill, decode, combined, s.knobs.PromptLengthBucketing)
	}
	if s.pt.bucketed {
		s.trace.Add("bucketing")
	}
	if s.pt.incomplete > 0 {
		traceUnpaired(s.trace, cy.Candidates)
	}
	return nil
}

// candidates runs a profile's filters, but for the scoring-only ones, over the candidates.
// A leading pd-role-filter takes its pods from one pass that sorts every candidate by role
// for the three profiles at once (the same pods, in the same order, as the filter's own).
func (h *RolesetHandler) candidates(ctx context.Context, cy *picker.Cycle, p *picker.Profile, split *roleSplit) []*pool.Endpoint {
	if p == nil {
		return nil
	}
	eps, filters := cy.Candidates, p.Filters
	if len(filters) > 0 {
		if rf, ok := filters[0].(*RoleFilter); ok {
			eps, filters = split.of(cy, rf.role, h), filters[1:]
		}
	}
	for _, f := range filters {
		if len(eps) == 0 {
			return nil
		}
		if _, scoringOnly := f.(interface{ ScoringOnly() }); scoringOnly {
			continue
		}
		eps = f.Filter(ctx, cy, eps)
	}
	if len(eps) == 0 {
		return nil
	}
	return eps
}

// roleSplit is the candidates sorted by the seed's roles, made on first use: the
// snapshot's sorting when the candidates are all its endpoints, else their own.
type roleSplit struct {
	done     bool
	sorted   *sortedRoles
	combined []*pool.Endpoint // sorted's other pods that may serve this request whole
}

// sortedRoles is endpoints sorted by role in one pass, with the roleset index of that
// sorting (the partition's first pass). A pod's role and roleset come from its labels, fixed
// for a snapshot's life, so the picks of a snapshot whose candidates are all its endpoints
// (no subset hint, no ejection) share one sorting and its partition (RolesetHandler.sorted);
// only the combined pods are found per request (whether a standard pod is combined depends
// on the request's routing profile). Read-only once made.
type sortedRoles struct {
	snap                   *pool.Snapshot // the snapshot whose endpoints these are; nil: a request's candidates
	prefill, decode, other []*pool.Endpoint
	ix                     rolesetIndex
	pt                     *partition // ix's partition without combined pods, made with the snapshot's sorting
	topo                   snapshotTopology
}

func sortByRole(eps []*pool.Endpoint) *sortedRoles {
	ss := &sortedRoles{}
	ss.ix.init(len(eps))
	for i, e := range eps {
		switch e.Role {
		case pool.RolePrefill:
			ss.prefill = append(ss.prefill, e)
		case pool.RoleDecode:
			ss.decode = append(ss.decode, e)
		default:
			ss.other = append(ss.other, e)
		}
		ss.ix.add(i, e, e.Role == pool.RolePrefill, e.Role == pool.RoleDecode)
	}
	return ss
}

// partition is the candidates' partition (the sorted endpoints) with the request's combined
// pods.
func (ss *sortedRoles) partition(cands, combined []*pool.Endpoint, bucketed bool) partition {
	var pt partition
	if ss.pt != nil {
		pt = *ss.pt
	} else {
		pt = ss.ix.partition(cands, nil, false)
	}
	pt.combined, pt.bucketed = combined, bucketed
	return pt
}

func sameSlice(a, b []*pool.Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// sorted is cy's candidates sorted by role: the snapshot's sorting, made once and kept, when
// they are the whole snapshot or one of its per-model views.
func (h *RolesetHandler) sorted(cy *picker.Cycle) *sortedRoles {
	if cy.Snap == nil {
		return sortByRole(cy.Candidates)
	}
	if sameSlice(cy.Candidates, cy.Snap.Endpoints) {
		if ss := h.bySnapshot.Load(); ss != nil && ss.snap == cy.Snap {
			return ss
		}
		ss := snapshotSort(cy.Snap, cy.Snap.Endpoints)
		h.bySnapshot.Store(ss)
		return ss
	}
	if len(cy.Candidates) == 0 || !cy.Snap.Owns(cy.Candidates) {
		return sortByRole(cy.Candidates)
	}
	key := &cy.Candidates[0]
	vs := h.byView.Load()
	if vs != nil && vs.snap == cy.Snap {
		if ss := vs.views[key]; ss != nil {
			return ss
		}
	}
	ss := snapshotSort(cy.Snap, cy.Candidates)
	next := &viewSorts{snap: cy.Snap, views: map[**pool.Endpoint]*sortedRoles{key: ss}}
	if vs != nil && vs.snap == cy.Snap {
		for k, v := range vs.views {
			next.views[k] = v
		}
	}
	h.byView.Store(next) // a racing store loses a view, which is sorted again: never a wrong one
	return ss
}

// snapshotSort sorts eps, a slice snap owns, by role, with its partition, to be kept.
func snapshotSort(snap *pool.Snapshot, eps []*pool.Endpoint) *sortedRoles {
	ss := sortByRole(eps)
	pt := ss.ix.partition(eps, nil, false)
	ss.snap, ss.pt = snap, &pt
	return ss
}

func (r *roleSplit) of(cy *picker.Cycle, role string, h *RolesetHandler) []*pool.Endpoint {
	if !r.done {
		r.done, r.sorted = true, h.sorted(cy)
		for _, e := range r.sorted.other {
			if isCombined(e, cy.Routing(e)) {
				r.combined = append(r.combined, e)
			}
		}
	}
	switch role {
	case RolePrefill:
		return r.sorted.prefill
	case RoleDecode:
		return r.sorted.decode
	}
	return r.combined
}

// Next implements picker.ProfileHandler: the fast paths, then the scoring rounds.
func (h *RolesetHandler) Next(_ context.Context, cy *picker.Cycle, _ []*picker.Profile, done map[string]*picker.ProfileResult) []picker.ProfileRun {
	s := selectionOf(cy)
	switch {
	case s.nonInference:
		if done[profileNonInference] == nil {
			return []picker.ProfileRun{{Profile: h.nonInference, Endpoints: cy.Candidates}}
		}
		return nil
	case len(s.pt.rolesets) == 0 || s.overflow:
		return nil
	}
	s.rounds++
	switch s.rounds {
	case 1:
		return h.fastPaths(cy, s)
	case 2:
		if h.pair(s) || s.relaxed {
			return nil
		}
		// The skip left no roleset with both sides: score the prefill side without it.
		s.relaxed = true
		s.trace.Add("stddev_skip_ignored")
		return []picker.ProfileRun{{Profile: h.prefillScoring, Endpoints: s.prefillEPs}}
	case 3:
		h.pair(s)
	}
	return nil
}

// fastPaths runs steps 0b, 1, 2 and 2b, builds the scoring batches and starts the scoring
// round. Inside the critical section.
func (h *RolesetHandler) fastPaths(cy *picker.Cycle, s *selection) []picker.ProfileRun {
	c, k, pt := h.c, s.knobs, &s.pt

	// Step 0b: a bucket match exists, but PD is saturated and a combined pod is idle. Only with
	// bucketing, as in AIBrix (its gateway collects combined pods and runs shouldPickCombined only
	// under AIBRIX_PROMPT_LENGTH_BUCKETING); docs/troubleshooting.md says when standard pods serve.
	if pt.bucketed && len(pt.combined) > 0 && h.overflow != nil && h.overflow.Overflow(cy, pt.combined, pt.rolesets) {
		s.overflow = true
		return nil
	}

	// The prefill and decode candidates, each with its roleset index.
	pre := make([]PrefillPod, 0, len(pt.prefill))
	preRS := make([]int, 0, len(pt.prefill))
	decEPs := pt.decode
	decRS := make([]int, 0, len(pt.decode))
	// A forecast-only prefill policy needs no in-flight counts unless step 1 or the
	// standard-deviation skip (the prefill profile's scoring-only filters) reads them.
	_, forecastOnly := s.prefPol.(ForecastOnly)
	inFlight := !forecastOnly || h.prefillFast != nil || len(h.prefillScoring.Filters) > 0
	for ri := range pt.rolesets {
		rs := &pt.rolesets[ri]
		for _, e := range rs.Prefill {
			p := PrefillPod{Endpoint: e, Roleset: rs.Name, MatchPct: s.match[e.Key()]}
			if inFlight {
				p.InFlight = float64(c.prefill.InFlightOf(e))
			}
			pre = append(pre, p)
			preRS = append(preRS, ri)
		}
		for range rs.Decode {
			decRS = append(decRS, ri)
		}
	}

	// Step 1: prefill load imbalance: the least-loaded prefill pod; decode narrowed to its roleset.
	if h.prefillFast != nil {
		if i := h.prefillFast.PrefillFastPath(cy, k, pre); i >= 0 {
			ri := preRS[i]
			pre, preRS = pre[i:i+1], preRS[i:i+1]
			decEPs, decRS = keepRoleset(decEPs, decRS, ri)
			s.fastSteps = append(s.fastSteps, StepPrefillImbalance)
			s.trace.Add(StepPrefillImbalance)
		}
	}

	// Step 2: decode load imbalance, prefill aligned to the chosen roleset. The batch keeps
	// the maxima of every decode candidate before this narrowing.
	fast := s.decPol.FastPath() && h.decodeFast != nil
	b := c.decodeBatch(cy, k, decEPs, decRS, pt.rolesets, decodeReadsOf(s.decPol, fast))
	if fast {
		if i, step := h.decodeFast.DecodeFastPath(cy, b); i >= 0 {
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
		if ri, ok := h.preferred(cy, s, preRS, decRS); ok {
			pre, preRS = keepRoleset(pre, preRS, ri)
			b.Pods, decRS = keepRoleset(b.Pods, decRS, ri)
			s.fastSteps = append(s.fastSteps, StepBucketServe)
			s.trace.Add(StepBucketServe)
		}
	}

	// Steps 3–5 run as the prefill and decode profiles, over what is left.
	s.trace.Add("prefill_score:" + s.prefPol.Name())
	s.trace.Add("decode_score:" + s.decPol.Name())
	s.pb = &PrefillBatch{Pods: pre, MaxInFlight: 1, PromptTokens: cy.Req.PromptTokens, Knobs: k, Objective: s.obj}
	if s.prefPol.Name() == PolicyConductor {
		s.pb.TokenizedLen = len(picker.PrefixText(cy))
	}
	b.PromptTokens, b.Objective = cy.Req.PromptTokens, s.obj
	for _, p := range pre {
		s.pb.MaxInFlight = math.Max(s.pb.MaxInFlight, p.InFlight)
	}
	s.preRS, s.b, s.decRS = preRS, b, decRS
	s.topo = h.topologyOf(s)
	costs := make([]float64, len(pre)+len(b.Pods))
	s.prefCost, s.decCost = costs[:len(pre):len(pre)], costs[len(pre):]
	// The profiles' inputs: the partition's own lists when no fast path narrowed them.
	s.prefillEPs = pt.prefill
	if len(pre) != len(pt.prefill) {
		s.prefillEPs = make([]*pool.Endpoint, len(pre))
		for i := range pre {
			s.prefillEPs[i] = pre[i].Endpoint
		}
	}
	decodeEPs := pt.decode
	if len(b.Pods) != len(pt.decode) {
		decodeEPs = make([]*pool.Endpoint, len(b.Pods))
		for i := range b.Pods {
			decodeEPs[i] = b.Pods[i].Endpoint
		}
	}
	return []picker.ProfileRun{{Profile: h.prefillScoring, Endpoints: s.prefillEPs}, {Profile: h.decodeScoring, Endpoints: decodeEPs}}
}

// pair runs steps 3–5 on the costs the policy scorers recorded; it reports whether a
// roleset kept both sides.
func (h *RolesetHandler) pair(s *selection) bool {
	c, nRS := h.c, len(s.pt.rolesets)
	var maxP, maxD float64
	s.bestP, s.scoreP, maxP = c.bestOf(s.prefCost, s.preRS, nRS, 1)
	if s.bestD == nil { // the retry re-scores the prefill side only
		s.bestD, s.scoreD, maxD = c.bestOf(s.decCost, s.decRS, nRS, decodeMaxScoreFloor)
		s.decMax = maxD
	}
	if s.absolute { // costs in the objectives' units: added as they are
		maxP, s.decMax = 1, 1
	}
	if s.topo.Len() > 0 {
		s.ri, s.finals = h.pairNear(s, s.topo, maxP, s.decMax)
		return s.ri >= 0
	}
	s.ri, s.finals = c.pair(s.bestP, s.scoreP, maxP, s.bestD, s.scoreD, s.decMax)
	return s.ri >= 0
}

// preferred asks the RolesetPreference among the rolesets with both sides left.
func (h *RolesetHandler) preferred(cy *picker.Cycle, s *selection, preRS, decRS []int) (int, bool) {
	rolesets := s.pt.rolesets
	hasP := make([]bool, len(rolesets))
	hasD := make([]bool, len(rolesets))
	for _, ri := range preRS {
		hasP[ri] = true
	}
	for _, ri := range decRS {
		hasD[ri] = true
	}
	both := make([]string, 0, len(rolesets))
	for ri := range rolesets {
		if hasP[ri] && hasD[ri] {
			both = append(both, rolesets[ri].Name)
		}
	}
	name, ok := h.c.prefer.Prefer(cy, both)
	if !ok || !slices.Contains(both, name) {
		return -1, false
	}
	for ri := range rolesets {
		if rolesets[ri].Name == name {
			return ri, true
		}
	}
	return -1, false
}

// Result implements picker.ProfileHandler.
func (h *RolesetHandler) Result(_ context.Context, cy *picker.Cycle, done map[string]*picker.ProfileResult) (*picker.Decision, error) {
	c, s := h.c, selectionOf(cy)
	defer s.recycle()
	switch {
	case s.nonInference:
		r := done[profileNonInference]
		tr := &picker.Trace{Candidates: len(cy.Candidates)}
		tr.Add(picker.StrategyLeastRequest)
		if tr.Scores = picker.RankedScores(done); tr.Scores != nil {
			tr.ScoreDirection = picker.HigherIsBetter
		}
		return &picker.Decision{Outcome: picker.OutcomeSingle, Step: StepNonInference, Destination: r.Ranked, Trace: tr,
			ResponseHeaders: map[string]string{picker.ResponseHeaderStrategy: picker.StrategyLeastRequest}}, nil
	case len(s.pt.rolesets) == 0:
		return c.noPair(cy, s, h.fallbacks)
	case s.overflow:
		return c.combinedDecision(s, StepCombinedOverflow, c.rankCombined(s, s.pt.combined), h.fallbacks), nil
	case s.ri < 0:
		return nil, apierror.Unavailable("no_pd_pair", "no roleset kept both a prefill and a decode candidate after scoring (%d rolesets)", len(s.pt.rolesets))
	}
	ri := s.ri
	pp, dp := &s.pb.Pods[s.bestP[ri]], &s.b.Pods[s.bestD[ri]]
	var opt Option
	if s.predictive {
		var err error
		if opt, err = h.place(cy, s, pp, dp); err != nil {
			return nil, err
		}
		if opt.Kind == outcome.KindWhole {
			return h.wholeDecision(s, opt, outputBound(cy.Req)), nil
		}
	}
	s.trace.Add(StepPair)
	traceDistance(s)
	if c.afterScoring != nil {
		c.afterScoring()
	}
	d := &picker.Decision{Outcome: picker.OutcomePD, Step: StepPair, Trace: s.trace,
		SetHeaders: map[string]string{HeaderPrefillerHostPort: pp.Endpoint.HostPort()}}
	if len(s.fastSteps) > 0 {
		d.Step = strings.Join(s.fastSteps, stepSeparator)
	}
	lc := newPairLifecycle(c, pp.Endpoint, dp.Endpoint, cy.Req.PromptTokens)
	lc.adopt(d)
	d.Destination = withFallbacks(h.fallbacks, dp.Endpoint, s.pt.rolesets[ri].Decode, func(e *pool.Endpoint) int64 {
		return c.deps.Running.InFlightOf(e) + c.pending.InFlightOf(e)
	})
	d.Destination = c.withCombinedFallbacks(d.Destination, s.pt.combined, h.fallbacks)
	lc.dest = d.Destination
	d.Prefill = withFallbacks(h.fallbacks, pp.Endpoint, s.pt.rolesets[ri].Prefill, func(e *pool.Endpoint) int64 {
		return c.prefill.InFlightOf(e)
	})
	s.trace.Scores = traceScores(&s.pt, s.finals, pp, s.scoreP[ri], dp, s.scoreD[ri])
	s.trace.ScoreDirection = picker.LowerIsBetter // costs; a prediction's milliseconds too
	if s.predictive {
		pr := predictor{c.models}
		lc.route.Cached(opt.Prompt.Cached)
		pr.charge(lc.RouteID(), opt, s.obj, outputBound(cy.Req))
		pr.traceOption(s.trace, opt)
	}
	return d, nil
}

// place predicts the pair and lets the placement deciders move the request (its prompt run
// whole on a decode pod, a standard pod) or shed it.
func (h *RolesetHandler) place(cy *picker.Cycle, s *selection, pp *PrefillPod, dp *DecodePod) (Option, error) {
	var fp, fd *latency.Forecast
	if s.pb.fc != nil {
		fp = &s.pb.fc[s.bestP[s.ri]]
	}
	if s.b.fc != nil {
		fd = &s.b.fc[s.bestD[s.ri]]
	}
	opt := predictor{h.c.models}.pairOption(s.obj, s.promptTokens, pp.Endpoint, fp, pp.MatchPct, dp.Endpoint, fd, s.distance())
	if len(h.placement) == 0 {
		return opt, nil
	}
	pl := &Placement{Cycle: cy, Objective: s.obj, PromptTokens: s.promptTokens, Match: s.match,
		Decode: s.pt.decode, Combined: s.pt.combined, Best: opt}
	if len(s.b.Pods) == len(s.pt.decode) && len(s.b.Pods) > 0 { // no fast path narrowed the decode side: the batch is pt.decode
		s.b.forecast(h.c.models, 0)
		pl.DecodeForecasts = s.b.fc
	}
	for _, d := range h.placement {
		d.Place(pl)
		if pl.Shed {
			break
		}
	}
	if len(pl.Notes) > 0 {
		s.trace.Note += "; " + strings.Join(pl.Notes, "; ")
	}
	if pl.Shed {
		return opt, apierror.Shed("no endpoint is predicted to answer within the request's TTFT objective of %.0f ms (best: %.0f ms), and it is sheddable; retry later or relax %s",
			s.obj.TTFT*1000, pl.Best.TTFT*1000, wire.HeaderSLOTTFT)
	}
	return pl.Best, nil
}

// wholeDecision sends the request whole to opt's destination: a decode pod running its
// prompt itself (decode_local), or a standard pod (slo_overflow, standard_cheaper);
// fallbacks are pods of the same kind, least loaded first. The option is booked on the
// models.
func (h *RolesetHandler) wholeDecision(s *selection, opt Option, maxTokens int) *picker.Decision {
	c := h.c
	peers, kind := s.pt.decode, picker.OutcomeLocal
	if opt.Step != StepDecodeLocal {
		peers, kind = s.pt.combined, picker.OutcomeCombined
	}
	ranked := leastLoaded(h.fallbacks, opt.Destination, peers, func(e *pool.Endpoint) int64 {
		return c.deps.Running.InFlightOf(e) + c.pending.InFlightOf(e)
	})
	s.trace.Add(opt.Step)
	lc := newWholeLifecycle(c, ranked, s.promptTokens)
	pr := predictor{c.models}
	lc.route.Cached(opt.Prompt.Cached)
	pr.charge(lc.RouteID(), opt, s.obj, maxTokens)
	pr.traceOption(s.trace, opt)
	d := &picker.Decision{Outcome: kind, Step: opt.Step, Destination: ranked, Trace: s.trace}
	lc.adopt(d)
	return d
}

// PostPick implements picker.PostPick: under the predictive plugins, the pod that now holds
// the prompt's KV — the decode pod of a pair (it keeps the blocks it pulled), or the pod that
// ran the whole request — joins the prefix index (the prefill pod is warmed by its scorer).
func (h *RolesetHandler) PostPick(_ context.Context, cy *picker.Cycle, d *picker.Decision) {
	s := selectionOf(cy)
	if s == nil || !s.predictive || len(d.Destination) == 0 {
		return
	}
	hashes := s.hashes
	if hashes == nil {
		hashes = picker.PromptHashes(cy, s.knobs.PrefixCache.BlockSize)
	}
	h.c.deps.WarmPrefix(cy.Req.Model, hashes, d.Destination[0].Key())
}

// decodeBatch reads each decode candidate's signals and the batch maxima, as much as reads
// asks (readForecastOnly: none; the drain rates only with readDrain). rs and rolesets name
// each pod's roleset (nil: the pod's own label).
func (c *Cascade) decodeBatch(_ *picker.Cycle, knobs *config.PD, eps []*pool.Endpoint, rs []int, rolesets []Roleset, reads decodeReads) *DecodeBatch {
	b := &DecodeBatch{Pods: make([]DecodePod, len(eps)), MaxRequests: 1, MaxThroughput: 1, MaxFreeGPU: 1, Knobs: knobs}
	for i, e := range eps {
		p := &b.Pods[i]
		p.Endpoint, p.Roleset = e, e.RolesetKey()
		if rs != nil {
			p.Roleset = rolesets[rs[i]].Name
		}
		if reads == readForecastOnly {
			continue
		}
		n, ok := c.deps.Running.LookupOf(e)
		p.Running, p.HasRunning = float64(n), ok
		p.Pending = float64(c.pending.InFlightOf(e))
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
		if reads == readDrain && c.deps.Drain != nil {
			p.Drain = c.deps.Drain.PerSecond(e.Key())
		}
		b.MaxRequests = math.Max(b.MaxRequests, p.Requests())
		b.MaxFreeGPU = math.Max(b.MaxFreeGPU, p.FreeGPU)
	}
	return b
}

var (
	_ picker.ProfileHandler = (*RolesetHandler)(nil)
	_ picker.DataProducer   = (*RolesetHandler)(nil)
	_ picker.Exclusive      = (*RolesetHandler)(nil)
	_ picker.ProfileBinder  = (*RolesetHandler)(nil)
	_ picker.RanksItself    = (*RolesetHandler)(nil)
	_ picker.PostPick       = (*RolesetHandler)(nil)
)

// outputBound is the request's max_tokens as the latency models take it: 0 (unknown) when it
// sets none or one out of range.
func outputBound(r *request.Request) int {
	if !r.HasMaxTokens || r.MaxTokens < 1 || r.MaxTokens >= 1<<31 {
		return 0
	}
	return int(r.MaxTokens)
}
