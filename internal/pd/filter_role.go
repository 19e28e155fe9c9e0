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

// Filter implements picker.Filter.
func (f *RoleFilter) Filter(_ context.Context, cy *picker.Cycle, eps []*pool.Endpoint) []*pool.Endpoint {
	switch f.role {
	case RolePrefill:
		return keepRole(eps, pool.RolePrefill)
	case RoleDecode:
		return keepRole(eps, pool.RoleDecode)
	}
	var out []*pool.Endpoint
	for _, e := range eps {
		if e.Role != pool.RolePrefill && e.Role != pool.RoleDecode && isCombined(e, cy.Routing(e)) {
			out = append(out, e) // combined pods are few: no room reserved for them
		}
	}
	return out
}

// keepRole keeps the pods of one role in one pass (it runs over every candidate of every
// PD pick): eps itself when all are of it, else a new slice sized for the rest.
func keepRole(eps []*pool.Endpoint, role pool.Role) []*pool.Endpoint {
	var out []*pool.Endpoint
	for i, e := range eps {
		switch {
		case e.Role == role && out != nil:
			out = append(out, e)
		case e.Role != role && out == nil:
			out = make([]*pool.Endpoint, i, len(eps)-1)
			copy(out, eps[:i])
		}
	}
	if out == nil {
		return eps
	}
	return out
}

// keepIf returns the endpoints keep accepts, in order: eps itself when it accepts all, nil
// when none, else exactly the ones it accepts (keep is asked twice per endpoint).
func keepIf(eps []*pool.Endpoint, keep func(*pool.Endpoint) bool) []*pool.Endpoint {
	n := 0
	for _, e := range eps {
		if keep(e) {
			n++
		}
	}
	switch n {
	case len(eps):
		return eps
	case 0:
		return nil
	}
	out := make([]*pool.Endpoint, 0, n)
	for _, e := range eps {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}
