package pd

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// The seed's prefill and decode score policies as picker scorers. A policy's raw score is a
// cost, lower is better, in its own units; the scorer's [0, 1] view is
// 1 − cost / max(floor, costs) (floor 1 for prefill, 0.01 for decode, the seed's pair()
// normalisation), 0 for a pod the policy cannot score. The roleset handler pairs on the raw
// costs the scorers leave in the cycle, so its arithmetic is the seed's to the last bit.
const (
	TypePrefillPolicyScorer = "prefill-policy-scorer"
	TypeDecodePolicyScorer  = "decode-policy-scorer"
)

type prefillPolicyParams struct {
	Policy string `json:"policy" default:"the request's: routingConfig.prefillScorePolicy, else AIBRIX_PREFILL_SCORE_POLICY" doc:"The registered prefill policy to score every request with; unset follows each request's profile, as the seed does (an unregistered name falls back to the gateway's, then prefix_cache)."`
}

type decodePolicyParams struct {
	Policy string `json:"policy" default:"the request's: routingConfig.decodeScorePolicy, else AIBRIX_DECODE_SCORE_POLICY" doc:"The registered decode policy to score every request with, in any case; unset follows each request's profile, as the seed does (an unregistered name fails the request with 503)."`
}

// policies is one request's pair of policies, resolved once per cycle.
type policies struct {
	prefill PrefillPolicy
	decode  DecodePolicy
	note    string
	err     error
}

var policiesKey = picker.NewStateKey[*policies]("pd.policies")

// policiesFor resolves the request's policies once per cycle: a fixed name when the scorer
// has one, else the seed's precedence (Policies.resolve). An unregistered prefill name
// falls back (noted, logged once); an unregistered decode name is an error.
func (c *Cascade) policiesFor(ctx context.Context, cy *picker.Cycle, fixedPrefill, fixedDecode string) *policies {
	sel := selectionOf(cy)
	if sel != nil && sel.policies != nil {
		return sel.policies
	}
	if p, ok := policiesKey.Read(cy.State); ok {
		return p
	}
	rc := cy.Resolved.Routing
	if fixedPrefill != "" {
		rc.PrefillScorePolicy = fixedPrefill
	}
	if fixedDecode != "" {
		rc.DecodeScorePolicy = fixedDecode
	}
	var p *policies
	if sel != nil {
		p = &sel.pols
	} else {
		p = &policies{}
	}
	p.prefill, p.decode, p.note, p.err = c.policies.resolve(c.gwPrefill, &cy.Resolved.PD, &rc)
	if p.note != "" {
		if _, seen := c.noted.LoadOrStore(p.note, struct{}{}); !seen {
			c.logger(ctx).Info("score policy not registered, falling back (logged once)", "request", cy.Req.ID, "detail", p.note)
		}
	}
	if p.err != nil {
		p.err = apierror.Unavailable("unknown_decode_policy",
			"%v; fix decodeScorePolicy in the model config or AIBRIX_DECODE_SCORE_POLICY", p.err)
	}
	if sel != nil {
		sel.policies = p
	} else {
		policiesKey.Write(cy.State, p)
	}
	return p
}

// PolicyScorer is prefill-policy-scorer or decode-policy-scorer. In the roleset handler's
// scoring round it scores the handler's batch; anywhere else it builds a batch from the
// endpoints it is given. As a DataProducer (prefill, prefix-using policies) it matches the
// prompt's prefix before the critical section; as a Reserver it charges a policy's ledger
// (Charger) inside it; as a PostPick it warms the prefix index with the prefill pod.
type PolicyScorer struct {
	picker.TypedName
	c       *Cascade
	prefill bool
	policy  string
}

// NewPrefillPolicyScorer and NewDecodePolicyScorer score with policy ("" : the request's).
func (c *Cascade) NewPrefillPolicyScorer(policy string) *PolicyScorer {
	return &PolicyScorer{picker.NewTypedName(TypePrefillPolicyScorer, ""), c, true, policy}
}

// NewDecodePolicyScorer is the decode side's scorer.
func (c *Cascade) NewDecodePolicyScorer(policy string) *PolicyScorer {
	return &PolicyScorer{picker.NewTypedName(TypeDecodePolicyScorer, ""), c, false, policy}
}

func (c *Cascade) newPolicyScorer(prefill bool) picker.Factory {
	return func(name string, raw json.RawMessage, _ *picker.Handle) (picker.Plugin, error) {
		var p prefillPolicyParams
		var into any = &p
		if !prefill {
			into = (*decodePolicyParams)(&p)
		}
		if err := picker.DecodeParams(raw, into); err != nil {
			return nil, err
		}
		typ := TypeDecodePolicyScorer
		if prefill {
			typ = TypePrefillPolicyScorer
		}
		if !prefill && strings.TrimSpace(p.Policy) != "" {
			// Decode policies are named in any case, as AIBRIX_DECODE_SCORE_POLICY and AIBrix take them.
			p.Policy = strings.ToLower(strings.TrimSpace(p.Policy))
		}
		if p.Policy != "" {
			pre, dec := c.policies.Names()
			valid := dec
			if prefill {
				valid = pre
			}
			if !slices.Contains(valid, p.Policy) {
				return nil, picker.BadParam("policy", p.Policy, fmt.Sprintf("must be a registered policy: %v", valid))
			}
		}
		return &PolicyScorer{picker.NewTypedName(typ, name), c, prefill, p.Policy}, nil
	}
}

func (s *PolicyScorer) resolve(ctx context.Context, cy *picker.Cycle) *policies {
	if s.prefill {
		return s.c.policiesFor(ctx, cy, s.policy, "")
	}
	return s.c.policiesFor(ctx, cy, "", s.policy)
}

// Produce implements picker.DataProducer: a prefix-using prefill policy gets the prompt's
// prefix match now, outside the critical section (the seed: after bucketing, only when a
// complete roleset is left).
func (s *PolicyScorer) Produce(ctx context.Context, cy *picker.Cycle) error {
	if !s.prefill {
		return nil
	}
	sel := selectionOf(cy)
	if sel == nil || sel.nonInference || len(sel.pt.rolesets) == 0 {
		return nil
	}
	if sel.prefPol.UsesPrefix() {
		s.c.matchPrefix(cy, sel)
	}
	return nil
}

// matchPrefix computes the prefix match % of every endpoint holding a prefix of the prompt.
func (c *Cascade) matchPrefix(cy *picker.Cycle, sel *selection) {
	if c.deps.Prefix == nil {
		return
	}
	b := picker.PromptBlocks(cy, sel.knobs.PrefixCache.BlockSize)
	sel.hashes = b.Hashes
	if len(sel.hashes) == 0 {
		return
	}
	c.deps.Prefix.MatchBlocks(cy.Req.Model, sel.hashes, func(key string, n int) {
		if sel.match == nil { // sized for every candidate: a shared prefix is on many
			sel.match = make(map[string]float64, len(cy.Candidates))
		}
		sel.match[key] = b.Pct(n)
	})
}

// Score implements picker.Scorer: the costs, then their [0, 1] view, in out.
func (s *PolicyScorer) Score(ctx context.Context, cy *picker.Cycle, eps []*pool.Endpoint, out []float64) {
	floor := decodeMaxScoreFloor
	if s.prefill {
		floor = 1
		s.prefillCosts(ctx, cy, eps, out)
	} else {
		s.decodeCosts(ctx, cy, eps, out)
	}
	hi := floor
	for _, v := range out {
		if v > hi { // false for NaN
			hi = v
		}
	}
	for i, v := range out {
		if math.IsNaN(v) {
			out[i] = 0
		} else {
			out[i] = 1 - v/hi
		}
	}
}

// walker finds the batch index of each endpoint of an ordered subsequence of the batch
// (the roleset handler's scoring round hands a profile the batch's endpoints in order, so
// the first probe is nearly always the answer).
type walker struct{ next int }

func (w *walker) index(n int, at func(int) *pool.Endpoint, e *pool.Endpoint) int {
	for k := w.next; k < n; k++ {
		if at(k) == e {
			w.next = k + 1
			return k
		}
	}
	return -1
}

// aligned reports whether eps are exactly the batch's endpoints, in order.
func aligned(n int, at func(int) *pool.Endpoint, eps []*pool.Endpoint) bool {
	if len(eps) != n {
		return false
	}
	for i, e := range eps {
		if at(i) != e {
			return false
		}
	}
	return true
}

// prefillCosts writes eps's costs into out. In the handler's scoring round it scores the
// handler's batch and records the costs there.
func (s *PolicyScorer) prefillCosts(ctx context.Context, cy *picker.Cycle, eps []*pool.Endpoint, out []float64) {
	sel := selectionOf(cy)
	if sel.scoring() {
		pol, pb := sel.prefPol, sel.pb
		for i := range sel.prefCost {
			sel.prefCost[i] = math.NaN()
		}
		at := func(k int) *pool.Endpoint { return pb.Pods[k].Endpoint }
		if aligned(len(pb.Pods), at, eps) {
			for i := range eps {
				out[i] = pol.Score(pb, i)
			}
			copy(sel.prefCost, out)
			return
		}
		var w walker
		for i, e := range eps {
			out[i] = math.NaN()
			if j := w.index(len(pb.Pods), at, e); j >= 0 {
				out[i] = pol.Score(pb, j)
				sel.prefCost[j] = out[i]
			}
		}
		return
	}
	p := s.resolve(ctx, cy)
	pb := &PrefillBatch{Pods: make([]PrefillPod, len(eps)), MaxInFlight: 1, PromptTokens: cy.Req.PromptTokens, Knobs: &cy.Resolved.PD}
	if p.prefill.Name() == PolicyConductor {
		pb.TokenizedLen = len(picker.PrefixText(cy))
	}
	var match map[string]float64
	if p.prefill.UsesPrefix() {
		tmp := &selection{knobs: &cy.Resolved.PD}
		s.c.matchPrefix(cy, tmp)
		match = tmp.match
	}
	for i, e := range eps {
		pb.Pods[i] = PrefillPod{Endpoint: e, Roleset: e.RolesetKey(), InFlight: float64(s.c.prefill.InFlightOf(e)),
			MatchPct: match[e.Key()], Sample: s.c.deps.Metrics.Get(e.Key())}
		pb.MaxInFlight = math.Max(pb.MaxInFlight, pb.Pods[i].InFlight)
	}
	for i := range eps {
		out[i] = p.prefill.Score(pb, i)
	}
	prefillBatchKey.Write(cy.State, pb)
}

// decodeCosts is prefillCosts for the decode side.
func (s *PolicyScorer) decodeCosts(ctx context.Context, cy *picker.Cycle, eps []*pool.Endpoint, out []float64) {
	sel := selectionOf(cy)
	var pol DecodePolicy
	var b *DecodeBatch
	if sel.scoring() {
		pol, b = sel.decPol, sel.b
		for i := range sel.decCost {
			sel.decCost[i] = math.NaN()
		}
	} else {
		pol = s.resolve(ctx, cy).decode
		if pol == nil {
			pol = loadBalancingPolicy{}
		}
		b = s.c.decodeBatch(cy, &cy.Resolved.PD, eps, nil, nil, decodeReadsOf(pol, false))
	}
	at := func(k int) *pool.Endpoint { return b.Pods[k].Endpoint }
	// The cold-start rule looks at every pod scored: a first pass for "has any the metric".
	anyMetrics := false
	var w walker
	for _, e := range eps {
		if j := w.index(len(b.Pods), at, e); j >= 0 && b.Pods[j].HasRunning {
			anyMetrics = true
			break
		}
	}
	w = walker{}
	for i, e := range eps {
		out[i] = math.NaN()
		if j := w.index(len(b.Pods), at, e); j >= 0 {
			out[i] = decodeCost(pol, b, j, anyMetrics)
			if sel.scoring() {
				sel.decCost[j] = out[i]
			}
		}
	}
	if !sel.scoring() {
		decodeBatchKey.Write(cy.State, b)
	}
}

// Reserve implements picker.Reserver: a policy with a ledger is charged for the chosen pair
// inside the critical section, and released by the decision's lifecycle.
func (s *PolicyScorer) Reserve(ctx context.Context, cy *picker.Cycle, d *picker.Decision) {
	lc, ok := d.Lifecycle.(*lifecycle)
	if !ok || d.Outcome != picker.OutcomePD || len(d.Prefill) == 0 {
		return
	}
	p := s.resolve(ctx, cy)
	var pol any = p.decode
	if s.prefill {
		pol = p.prefill
	}
	switch ch := pol.(type) {
	case CycleCharger:
		lc.charge(ch.ChargeCycle(cy, d.Prefill[0], d.Destination[0]))
	case Charger:
		lc.charge(ch.Charge(cy.Req, d.Prefill[0], d.Destination[0]))
	}
}

// PostPick implements picker.PostPick: with a prefix-using prefill policy, the prefill pod
// now holds the prompt's prefix.
func (s *PolicyScorer) PostPick(ctx context.Context, cy *picker.Cycle, d *picker.Decision) {
	if !s.prefill || len(d.Prefill) == 0 {
		return
	}
	if p := s.resolve(ctx, cy); p.prefill == nil || !p.prefill.UsesPrefix() {
		return
	}
	hashes := picker.PromptBlocks(cy, cy.Resolved.PD.PrefixCache.BlockSize).Hashes
	if sel := selectionOf(cy); sel != nil {
		hashes = sel.hashes
	}
	s.c.deps.WarmPrefix(cy.Req.Model, hashes, d.Prefill[0].Key())
}

var (
	_ picker.Scorer       = (*PolicyScorer)(nil)
	_ picker.DataProducer = (*PolicyScorer)(nil)
	_ picker.Reserver     = (*PolicyScorer)(nil)
	_ picker.PostPick     = (*PolicyScorer)(nil)
)
