package pd

import (
	"github.com/tandem-epp/tandem/internal/bucketserve"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// BucketServe is step 2b, adaptive bucket serving, as the cascade's RolesetPreference: it
// records each routed prompt length in the planner and names the roleset the model's
// current plan bands that length to. Pass it as Options.Preference; the cascade consults it
// only for requests whose resolved configuration has bucketServe and bucketing on, and
// narrows to the roleset only when it still has both sides.
type BucketServe struct {
	Planner *bucketserve.Planner
}

// Prefer implements RolesetPreference. The plan covers every complete roleset of the
// request's candidates (declared ranges, before bucketing removed any), not just the ones
// left after the fast paths, so one plan serves every request of the model.
func (b *BucketServe) Prefer(cy *picker.Cycle, rolesets []string) (string, bool) {
	groups := rolesetGroups(cy)
	if len(groups) == 0 {
		return "", false
	}
	mode := bucketserve.ParseMode(cy.Resolved.PD.BucketServeMode)
	n := promptLength(cy)
	if bands := b.Planner.Bands(cy.Req.Model, mode, groups); len(bands) > 0 {
		// The plan's cuts are boundaries the candidates' ranges do not name: the length must
		// lie on the side of them its count does too.
		cuts := make([]int, 0, 2*len(bands))
		for _, bd := range bands {
			cuts = append(cuts, bd.Min)
			if bd.Max < bucketserve.Unlimited {
				cuts = append(cuts, bd.Max+1)
			}
		}
		n = probeLength(cy, cy.Candidates, cuts)
	}
	band, ok := b.Planner.Band(cy.Req.Model, mode, n, groups)
	if !ok {
		return "", false
	}
	for _, rs := range rolesets {
		if rs == band.Roleset {
			b.Planner.Routed(band, n)
			return rs, true
		}
	}
	return "", false
}

// rolesetGroups describes each complete roleset among the candidates: the prompt-length
// range all its pods declare (the intersection of their ranges) and its prefill replicas
// (distinct pods; the ports of one pod count once).
func rolesetGroups(cy *picker.Cycle) []bucketserve.Group {
	type acc struct {
		g           bucketserve.Group
		decode      bool
		prefillPods map[string]struct{}
		lastPrefill *pool.Endpoint // ports of one pod are adjacent: count the pod once
	}
	idx := map[string]int{}
	var accs []*acc
	for _, e := range cy.Candidates {
		if e.Role != pool.RolePrefill && e.Role != pool.RoleDecode {
			continue
		}
		i, ok := idx[e.RolesetKey()]
		if !ok {
			i = len(accs)
			idx[e.RolesetKey()] = i
			accs = append(accs, &acc{g: bucketserve.Group{Name: e.RolesetKey(), Max: bucketserve.Unlimited}, prefillPods: map[string]struct{}{}})
		}
		a := accs[i]
		if cy.PodRouting != nil {
			rc := cy.PodRouting(e)
			a.g.Min = max(a.g.Min, rc.PromptLenBucketMinLength)
			if hi := rc.PromptLenBucketMaxLength; hi > 0 {
				a.g.Max = min(a.g.Max, hi)
			}
		}
		if e.Role == pool.RoleDecode {
			a.decode = true
			continue
		}
		if last := a.lastPrefill; last == nil || last.Name != e.Name || last.Namespace != e.Namespace {
			a.prefillPods[e.PodKey()] = struct{}{}
			a.lastPrefill = e
		}
	}
	out := make([]bucketserve.Group, 0, len(accs))
	for _, a := range accs {
		if a.decode && len(a.prefillPods) > 0 {
			a.g.Replicas = len(a.prefillPods)
			out = append(out, a.g)
		}
	}
	return out
}

var _ RolesetPreference = (*BucketServe)(nil)
