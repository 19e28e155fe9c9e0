package pd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// TypeDisaggHandler is llm-d's disaggregation profile handler.
const TypeDisaggHandler = "disagg-profile-handler"

// Stage orders of the disagg handler (llm-d's names; "decode"/"prefill" and any case or
// "_" are accepted, as llm-d accepts them).
const (
	StageOrderDecodeFirst  = "decode-first"
	StageOrderPrefillFirst = "prefill-first"
)

// llm-d's decision names, the disagg handler's Decision.Step.
const (
	StepDecodeOnly    = "decode-only"
	StepPrefillDecode = "prefill-decode"
)

type disaggParams struct {
	StageOrder string `json:"stageOrder" default:"decode-first" doc:"decode-first: the decode profile runs first and the prefill decider looks at its pick; prefill-first: the prefill profile always runs, then decode."`
	Profiles   struct {
		Decode  string `json:"decode" default:"decode" doc:"The decode profile (required)."`
		Prefill string `json:"prefill" default:"prefill" doc:"The prefill profile; without it no request is disaggregated."`
		Encode  string `json:"encode" default:"encode" doc:"llm-d's encode profile (E/P/D); Tandem runs no encode stage."`
	} `json:"profiles"`
	Deciders struct {
		Prefill string `json:"prefill" doc:"The decider (prefix-based-pd-decider, always-disagg-pd-decider) that says, from the decode pick, whether to run the prefill profile; unset: no disaggregation."`
		Encode  string `json:"encode" doc:"llm-d's encode decider; not supported (Tandem has no encode stage)."`
	} `json:"deciders"`
}

// legacyDisaggParams is llm-d's deprecated flat form (and pd-profile-handler's names).
type legacyDisaggParams struct {
	StageOrder               string `json:"stageOrder"`
	DecodeProfile            string `json:"decodeProfile"`
	PrefillProfile           string `json:"prefillProfile"`
	EncodeProfile            string `json:"encodeProfile"`
	PrefillDeciderPluginName string `json:"prefillDeciderPluginName"`
	EncodeDeciderPluginName  string `json:"encodeDeciderPluginName"`
	DeciderPluginName        string `json:"deciderPluginName"`
}

// PDDecider says whether a request whose decode pod is endpoint should be disaggregated
// (llm-d's decider plugins). endpoint is nil in prefill-first order.
type PDDecider interface {
	picker.Plugin
	Disaggregate(cy *picker.Cycle, endpoint *pool.Endpoint) bool
}

// DisaggHandler is llm-d's disagg-profile-handler (P/D; no encode stage): in decode-first
// order the decode profile picks the destination, then the prefill decider, looking at that
// pick, says whether the prefill profile runs; its pick becomes the prefill target. In
// prefill-first order the prefill profile runs whenever it exists, then decode. The prefill
// target is the best-ranked prefill pod of the decode pick's revision (the pair-match labels):
// with none, the request is served decode-only. A PD pick counts in the PD trackers as the
// seed's pairs do.
type DisaggHandler struct {
	picker.TypedName
	c                    *Cascade
	prefillFirst         bool
	decodeName, prefName string
	decider              PDDecider
	decode, prefill      *picker.Profile
}

func (c *Cascade) newDisaggHandler(name string, raw json.RawMessage, h *picker.Handle) (picker.Plugin, error) {
	var p disaggParams
	if err := picker.DecodeParams(raw, &p); err != nil {
		// llm-d accepts its deprecated flat form when the nested one does not decode.
		var legacy legacyDisaggParams
		if lerr := picker.DecodeParams(raw, &legacy); lerr != nil {
			return nil, err
		}
		h.Warn("%s %q: flat parameters are deprecated in llm-d; use profiles: and deciders:", TypeDisaggHandler, name)
		p.StageOrder = legacy.StageOrder
		p.Profiles.Decode, p.Profiles.Prefill, p.Profiles.Encode = legacy.DecodeProfile, legacy.PrefillProfile, legacy.EncodeProfile
		p.Deciders.Prefill, p.Deciders.Encode = legacy.PrefillDeciderPluginName, legacy.EncodeDeciderPluginName
		if p.Deciders.Prefill == "" {
			p.Deciders.Prefill = legacy.DeciderPluginName
		}
	}
	order := strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(p.StageOrder))
	d := &DisaggHandler{TypedName: picker.NewTypedName(TypeDisaggHandler, name), c: c,
		decodeName: ProfileDecode, prefName: ProfilePrefill}
	switch order {
	case "", "decodefirst", "decode":
	case "prefillfirst", "prefill":
		d.prefillFirst = true
	default:
		return nil, picker.BadParam("stageOrder", p.StageOrder, "must be decode-first or prefill-first")
	}
	if p.Deciders.Encode != "" {
		return nil, picker.BadParam("deciders.encode", p.Deciders.Encode, "encode disaggregation (E/P/D) is not supported by Tandem; remove it")
	}
	if d.prefillFirst && p.Deciders.Prefill != "" {
		return nil, picker.BadParam("deciders.prefill", p.Deciders.Prefill, "a prefill decider is not supported in prefill-first stage order (as in llm-d)")
	}
	if p.Profiles.Decode != "" {
		d.decodeName = p.Profiles.Decode
	}
	if p.Profiles.Prefill != "" {
		d.prefName = p.Profiles.Prefill
	}
	if p.Deciders.Prefill != "" {
		pl, err := h.Require(p.Deciders.Prefill)
		if errors.Is(err, picker.ErrNotBuilt) {
			return nil, err // built again once the decider is
		}
		if err != nil {
			return nil, &picker.ParamError{Field: "deciders.prefill", Value: p.Deciders.Prefill, Rule: err.Error()}
		}
		dec, ok := pl.(PDDecider)
		if !ok {
			return nil, picker.BadParam("deciders.prefill", p.Deciders.Prefill, "names a "+pl.Type()+", which is not a PD decider")
		}
		d.decider = dec
	}
	return d, nil
}

// Bind implements picker.ProfileBinder: the decode profile is required.
func (h *DisaggHandler) Bind(profiles []*picker.Profile) error {
	for _, p := range profiles {
		switch p.Name {
		case h.decodeName:
			h.decode = p
		case h.prefName:
			h.prefill = p
		}
	}
	if h.decode == nil {
		return fmt.Errorf("%s needs a scheduling profile named %q (profiles.decode)", TypeDisaggHandler, h.decodeName)
	}
	return nil
}

// Next implements picker.ProfileHandler.
func (h *DisaggHandler) Next(_ context.Context, cy *picker.Cycle, _ []*picker.Profile, done map[string]*picker.ProfileResult) []picker.ProfileRun {
	_, decoded := done[h.decodeName]
	_, prefilled := done[h.prefName]
	if h.prefillFirst {
		switch {
		case decoded:
			return nil
		case h.prefill != nil && !prefilled:
			return []picker.ProfileRun{{Profile: h.prefill}}
		}
		return []picker.ProfileRun{{Profile: h.decode}}
	}
	switch {
	case !decoded:
		return []picker.ProfileRun{{Profile: h.decode}}
	case prefilled || h.prefill == nil || h.decider == nil:
		return nil
	}
	if r := done[h.decodeName]; r != nil && len(r.Ranked) > 0 && h.decider.Disaggregate(cy, r.Ranked[0]) {
		return []picker.ProfileRun{{Profile: h.prefill}}
	}
	done[h.prefName] = nil // decided: no prefill stage
	return nil
}

// Result implements picker.ProfileHandler: the decode pick is the destination; the prefill
// pick, when the stage ran, the prefill target.
func (h *DisaggHandler) Result(_ context.Context, cy *picker.Cycle, done map[string]*picker.ProfileResult) (*picker.Decision, error) {
	dr := done[h.decodeName]
	if dr == nil || len(dr.Ranked) == 0 {
		return nil, errors.New("failed to find available decode workers")
	}
	d := &picker.Decision{Destination: dr.Ranked, Step: StepDecodeOnly}
	if pr := done[h.prefName]; pr != nil && len(pr.Ranked) > 0 {
		// The pair-match labels: no prefill pod, and no decode fallback (the gateway hands it
		// the same prefill target), of another revision than the decode pick's. The pick is
		// the best-ranked decode pod whose revision has a prefill pod (mid-rollout, the best
		// one's may have none yet); with none, the best one serves decode-only.
		decode := dr.Ranked[0]
		for _, e := range dr.Ranked {
			if slices.ContainsFunc(pr.Ranked, func(p *pool.Endpoint) bool { return p.Revision == e.Revision }) {
				decode = e
				break
			}
		}
		rev := decode.Revision
		// Among the decode pick's revision's prefill pods tied for the best score, the nearest
		// to the decode pick first.
		prefill := nearestTied(cy.Resolved.PD.Topology, ofRevision(pr, rev), decode)
		dest := sameRevision(dr.Ranked, rev)
		if len(prefill) < len(pr.Ranked) {
			d.Trace = &picker.Trace{Steps: []string{StepPairMatchUnpaired}}
			traceSkipped(d.Trace, pr.Ranked, rev)
		}
		if len(prefill) > 0 {
			d.Destination, d.Prefill, d.Outcome, d.Step = dest, prefill, picker.OutcomePD, StepPrefillDecode
			d.SetHeaders = map[string]string{HeaderPrefillerHostPort: prefill[0].HostPort()}
			lc := newPairLifecycle(h.c, prefill[0], decode, cy.Req.PromptTokens)
			lc.dest = d.Destination
			lc.adopt(d)
		}
	}
	return d, nil
}

// ofRevision is the profile result with only the endpoints of revision rev; pr itself when all
// are.
func ofRevision(pr *picker.ProfileResult, rev string) *picker.ProfileResult {
	ranked := sameRevision(pr.Ranked, rev)
	if len(ranked) == len(pr.Ranked) {
		return pr
	}
	out := &picker.ProfileResult{Ranked: ranked}
	for _, se := range pr.Scored {
		if se.Endpoint.Revision == rev {
			out.Scored = append(out.Scored, se)
		}
	}
	return out
}

// sameRevision keeps the endpoints of eps (in order) whose Revision is rev; eps itself when
// all are.
func sameRevision(eps []*pool.Endpoint, rev string) []*pool.Endpoint {
	for i, e := range eps {
		if e.Revision != rev {
			out := append([]*pool.Endpoint(nil), eps[:i]...)
			for _, e := range eps[i+1:] {
				if e.Revision == rev {
					out = append(out, e)
				}
			}
			return out
		}
	}
	return eps
}

// traceSkipped names in tr the prefill pods of eps the pair-match labels kept from pairing
// with a decode pod of revision rev (at most maxTracedUnpaired).
func traceSkipped(tr *picker.Trace, eps []*pool.Endpoint, rev string) {
	tr.Unpaired = map[string]string{}
	for _, e := range eps {
		if e.Revision != rev && len(tr.Unpaired) < maxTracedUnpaired {
			tr.Unpaired[e.Key()] = e.RolesetKey()
		}
	}
}

var (
	_ picker.ProfileHandler = (*DisaggHandler)(nil)
	_ picker.ProfileBinder  = (*DisaggHandler)(nil)
)
