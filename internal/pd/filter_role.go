package pd

import (
	"context"
	"encoding/json"

	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// TypeRoleFilter is the seed's role filter.
const TypeRoleFilter = "pd-role-filter"

// Roles a pd-role-filter keeps.
const (
	RolePrefill  = "prefill"
	RoleDecode   = "decode"
	RoleCombined = "combined"
)

type roleFilterParams struct {
	Role string `json:"role" default:"(required)" doc:"prefill, decode or combined: the pods that role-name (else llm-d.ai/role) names prefill or decode; combined: a pod with neither that declares combined: true in its routingConfig, or llm-d.ai/role prefill-decode or both."`
}

// RoleFilter keeps the pods of one PD role as the seed classifies them (role-name first,
// then llm-d.ai/role).
type RoleFilter struct {
	picker.TypedName
	role string
}

// NewRoleFilter returns the filter keeping role (RolePrefill, RoleDecode or RoleCombined).
func NewRoleFilter(role string) *RoleFilter {
	return &RoleFilter{picker.NewTypedName(TypeRoleFilter, TypeRoleFilter+"/"+role), role}
}

func newRoleFilter(name string, raw json.RawMessage, _ *picker.Handle) (picker.Plugin, error) {
	var p roleFilterParams
	if err := picker.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	switch p.Role {
	case RolePrefill, RoleDecode, RoleCombined:
	default:
		return nil, picker.BadParam("role", p.Role, "must be prefill, decode or combined")
	}
	return &RoleFilter{picker.NewTypedName(TypeRoleFilter, name), p.Role}, nil
}

func (f *RoleFilter) keeps(cy *picker.Cycle, e *pool.Endpoint) bool {
	switch f.role {
	case RolePrefill:
		return e.Role == pool.RolePrefill
	case RoleDecode:
		return e.Role == pool.RoleDecode
	}
	return e.Role != pool.RolePrefill && e.Role != pool.RoleDecode && isCombined(e, cy.Routing(e))
}

// Filter implements picker.Filter. When it keeps every pod it returns eps itself.
func (f *RoleFilter) Filter(_ context.Context, cy *picker.Cycle, eps []*pool.Endpoint) []*pool.Endpoint {
	return keepIf(eps, func(e *pool.Endpoint) bool { return f.keeps(cy, e) })
}

// keepIf returns the endpoints keep accepts, in order; eps itself when it accepts all (the
// scoring round re-runs the partition's filters on what they already kept).
func keepIf(eps []*pool.Endpoint, keep func(*pool.Endpoint) bool) []*pool.Endpoint {
	for i, e := range eps {
		if keep(e) {
			continue
		}
		out := make([]*pool.Endpoint, i, len(eps))
		copy(out, eps[:i])
		for _, e := range eps[i+1:] {
			if keep(e) {
				out = append(out, e)
			}
		}
		return out
	}
	return eps
}
