package picker

import (
	"context"
	"encoding/json"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Role filter type names.
const (
	// TypeDecodeRoleFilter is Tandem's: every pod but a prefill-only one.
	TypeDecodeRoleFilter = "decode-role-filter"
	// TypeDecodeFilter and TypePrefillFilter are llm-d's role filters.
	TypeDecodeFilter  = "decode-filter"
	TypePrefillFilter = "prefill-filter"
)

// llm-d's llm-d.ai/role values that may decode, and that may prefill (llm-d-router v0.10.0,
// filter/bylabel/roles.go). A pod without the label may decode, not prefill.
var (
	llmdDecodeRoles  = map[string]bool{"decode": true, "prefill-decode": true, "both": true, "encode-prefill-decode": true}
	llmdPrefillRoles = map[string]bool{"prefill": true, "encode-prefill": true, "prefill-decode": true, "both": true, "encode-prefill-decode": true}
)

// DecodeRoleFilter drops prefill-only endpoints: a non-PD strategy must never send a whole
// request to a pod that only runs prefill. Every non-PD strategy applies it.
type DecodeRoleFilter struct{ TypedName }

// NewDecodeRoleFilter returns the filter.
func NewDecodeRoleFilter() *DecodeRoleFilter {
	return &DecodeRoleFilter{NewTypedName(TypeDecodeRoleFilter, "")}
}

// Filter implements Filter.
func (f *DecodeRoleFilter) Filter(_ context.Context, _ *Cycle, eps []*pool.Endpoint) []*pool.Endpoint {
	out := make([]*pool.Endpoint, 0, len(eps))
	for _, e := range eps {
		if e.Role != pool.RolePrefill {
			out = append(out, e)
		}
	}
	return out
}

// LabelRoleFilter is llm-d's decode-filter or prefill-filter over the llm-d.ai/role label,
// with the seed's role-name label read first: role-name prefill may only prefill, decode
// only decode, any other value (a standard pod) only serve whole requests.
type LabelRoleFilter struct {
	TypedName
	prefill bool
}

// Filter implements Filter.
func (f *LabelRoleFilter) Filter(_ context.Context, _ *Cycle, eps []*pool.Endpoint) []*pool.Endpoint {
	out := make([]*pool.Endpoint, 0, len(eps))
	for _, e := range eps {
		if f.keeps(e) {
			out = append(out, e)
		}
	}
	return out
}

func (f *LabelRoleFilter) keeps(e *pool.Endpoint) bool {
	key, v := pool.RoleLabel(e.Labels)
	switch {
	case key == pool.LabelRoleName:
		return (v == string(pool.RolePrefill)) == f.prefill
	case f.prefill:
		return llmdPrefillRoles[v]
	}
	_, labelled := e.Labels[key]
	return !labelled || llmdDecodeRoles[v]
}

func newRoleFilter(typ string) Factory {
	return func(name string, raw json.RawMessage, _ *Handle) (Plugin, error) {
		if err := DecodeParams(raw, nil); err != nil {
			return nil, err
		}
		switch typ {
		case TypeDecodeRoleFilter:
			return &DecodeRoleFilter{NewTypedName(typ, name)}, nil
		case TypePrefillFilter:
			return &LabelRoleFilter{NewTypedName(typ, name), true}, nil
		}
		return &LabelRoleFilter{NewTypedName(typ, name), false}, nil
	}
}
