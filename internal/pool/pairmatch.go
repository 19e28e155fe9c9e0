package pool

import (
	"sort"
	"strings"
)

// LabelDisaggRevision is the revision label the DisaggregatedSet controller (an LWS
// subproject, used by llm-d) puts on the prefill and the decode pods of one revision: a hash
// of both roles' templates, so both sides of a revision carry the same value.
const LabelDisaggRevision = "disaggregatedset.x-k8s.io/revision"

// PairMatch lists the pod label keys whose values must be equal on a prefill and a decode pod
// for Tandem to pair them (TANDEM_PAIR_MATCH_LABELS). A label absent on both pods matches; a
// label present on one side only does not. The empty list matches every pair.
type PairMatch []string

// DefaultPairMatch is the labels matched unless configured otherwise.
var DefaultPairMatch = PairMatch{LabelDisaggRevision}

// Revision is what of labels the match labels see: "key=value" for each match label the
// pod carries, in the configured order, comma-separated; "" when it carries none. Two pods
// may be paired exactly when their Revisions are equal.
func (m PairMatch) Revision(labels map[string]string) string {
	var b strings.Builder
	for _, k := range m {
		v, ok := labels[k]
		if !ok {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	return b.String()
}

// NewEndpoint is NewEndpoint with the endpoint's Revision read by m: the constructor the pool
// sources use.
func (m PairMatch) NewEndpoint(namespace, name, address string, port int32, rank int, labels, annotations map[string]string) *Endpoint {
	e := newEndpoint(namespace, name, address, port, rank, labels, annotations)
	e.Revision = m.Revision(e.Labels)
	e.rolesetKey = rolesetKey(e.Roleset, e.Revision)
	return e
}

// rolesetKey is a roleset's identity: its name, and the match-label values of its revision.
func rolesetKey(name, revision string) string {
	if revision == "" {
		return name
	}
	return name + "@" + revision
}

// RolesetKey is the endpoint's roleset identity: the roleset-name, followed by "@" and the
// Revision when the pod carries a match label. Pods pair only within one RolesetKey, so a
// roleset in the middle of a rolling update is one roleset per revision.
func (e *Endpoint) RolesetKey() string { return e.rolesetKey }

// RolesetGroup is one roleset identity's prefill and decode endpoints (of one model).
type RolesetGroup struct {
	Model string
	// Key is the RolesetKey; Name the roleset-name ("" for pods without one).
	Key, Name       string
	Prefill, Decode []*Endpoint
}

// Revision is the match-label values the group's pods carry, as PairMatch.Revision writes
// them, or "(none)" when they carry no match label.
func (g *RolesetGroup) Revision() string {
	if g.Key == g.Name {
		return "(none)"
	}
	return g.Key[len(g.Name)+1:]
}

// Complete says whether the group can serve a prefill/decode pair.
func (g *RolesetGroup) Complete() bool { return len(g.Prefill) > 0 && len(g.Decode) > 0 }

// Rolesets groups the prefill and decode endpoints among eps by model and roleset identity
// (RolesetKey), sorted by model then key; standard endpoints are left out. Pods without a
// roleset-name form the rolesets of name "": llm-d labels no rolesets and pairs any of its
// prefill pods with any decode pod (of one revision). Every reader of roleset completeness
// (the pool check, start-up warnings, the roleset metric, passive health's last-pair guard)
// groups through it, over a whole pool through Snapshot.Rolesets, which groups once per
// snapshot.
func Rolesets(eps []*Endpoint) []*RolesetGroup {
	type id struct{ model, key string }
	idx := map[id]*RolesetGroup{}
	var out []*RolesetGroup
	for _, e := range eps {
		if e.Role != RolePrefill && e.Role != RoleDecode {
			continue
		}
		k := id{e.Model, e.rolesetKey}
		g := idx[k]
		if g == nil {
			g = &RolesetGroup{Model: e.Model, Key: e.rolesetKey, Name: e.Roleset}
			idx[k] = g
			out = append(out, g)
		}
		if e.Role == RolePrefill {
			g.Prefill = append(g.Prefill, e)
		} else {
			g.Decode = append(g.Decode, e)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Model != out[j].Model {
			return out[i].Model < out[j].Model
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// SplitByMatch lists the groups the match labels left without a pair: their roleset identity
// lacks a side, while the pods of the same roleset-name and model, all revisions together,
// have both (so without the match labels they would be paired). In the order of groups.
func SplitByMatch(groups []*RolesetGroup) []*RolesetGroup {
	type id struct{ model, name string }
	type sides struct{ prefill, decode, split bool }
	byName := map[id]*sides{}
	for _, g := range groups {
		s := byName[id{g.Model, g.Name}]
		if s == nil {
			s = &sides{}
			byName[id{g.Model, g.Name}] = s
		}
		s.prefill = s.prefill || len(g.Prefill) > 0
		s.decode = s.decode || len(g.Decode) > 0
		s.split = s.split || g.Key != g.Name
	}
	var out []*RolesetGroup
	for _, g := range groups {
		if s := byName[id{g.Model, g.Name}]; !g.Complete() && s.split && s.prefill && s.decode {
			out = append(out, g)
		}
	}
	return out
}
