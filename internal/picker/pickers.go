package picker

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Picker type names (GIE's and llm-d's).
const (
	TypeMaxScorePicker = "max-score-picker"
	TypeRandomPicker   = "random-picker"
)

// DefaultFallbacks is how many fallback endpoints follow the primary unless configured.
const DefaultFallbacks = 2

// pickerParams: GIE's and llm-d's maxNumOfEndpoints, or Tandem's maxFallbacks.
type pickerParams struct {
	MaxNumOfEndpoints *int `json:"maxNumOfEndpoints" default:"primary + 2 fallbacks" doc:"Endpoints returned, the primary first (GIE, llm-d; they default to 1, Tandem adds fallbacks the gateway may retry)."`
	MaxFallbacks      *int `json:"maxFallbacks" default:"2" doc:"Fallbacks after the primary (Tandem); set this or maxNumOfEndpoints."`
}

func decodePickerParams(raw json.RawMessage) (int, error) {
	var p pickerParams
	if err := DecodeParams(raw, &p); err != nil {
		return 0, err
	}
	switch {
	case p.MaxNumOfEndpoints != nil && p.MaxFallbacks != nil:
		return 0, &ParamError{Field: "maxFallbacks", Rule: "set maxNumOfEndpoints or maxFallbacks, not both"}
	case p.MaxNumOfEndpoints != nil && *p.MaxNumOfEndpoints < 1:
		return 0, BadParam("maxNumOfEndpoints", *p.MaxNumOfEndpoints, "must be 1 or more")
	case p.MaxNumOfEndpoints != nil:
		return *p.MaxNumOfEndpoints - 1, nil
	case p.MaxFallbacks != nil && *p.MaxFallbacks < 0:
		return 0, BadParam("maxFallbacks", *p.MaxFallbacks, "must be >= 0")
	case p.MaxFallbacks != nil:
		return *p.MaxFallbacks, nil
	}
	return DefaultFallbacks, nil
}

// MaxScorePicker ranks by score, highest first, ties at random, keeping MaxFallbacks fallbacks.
type MaxScorePicker struct {
	TypedName
	MaxFallbacks int
}

// NewMaxScorePicker returns the picker with the default fallbacks.
func NewMaxScorePicker() *MaxScorePicker {
	return &MaxScorePicker{NewTypedName(TypeMaxScorePicker, ""), DefaultFallbacks}
}

// Pick implements Picker.
func (p *MaxScorePicker) Pick(_ context.Context, c *Cycle, scored []ScoredEndpoint) []*pool.Endpoint {
	type ranked struct {
		ScoredEndpoint
		tie int
	}
	rs := make([]ranked, len(scored))
	for i, s := range scored {
		rs[i] = ranked{s, c.RandN(1 << 30)}
	}
	slices.SortFunc(rs, func(a, b ranked) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return cmp.Compare(a.tie, b.tie)
	})
	n := min(len(rs), p.MaxFallbacks+1)
	out := make([]*pool.Endpoint, n)
	for i := range out {
		out[i] = rs[i].Endpoint
	}
	return out
}

// RandomPicker ranks uniformly at random, keeping MaxFallbacks fallbacks.
type RandomPicker struct {
	TypedName
	MaxFallbacks int
}

// NewRandomPicker returns the picker with the default fallbacks.
func NewRandomPicker() *RandomPicker {
	return &RandomPicker{NewTypedName(TypeRandomPicker, ""), DefaultFallbacks}
}

// Pick implements Picker.
func (p *RandomPicker) Pick(_ context.Context, c *Cycle, scored []ScoredEndpoint) []*pool.Endpoint {
	out := make([]*pool.Endpoint, len(scored))
	for i, s := range scored {
		out[i] = s.Endpoint
	}
	for i := len(out) - 1; i > 0; i-- { // Fisher–Yates from the cycle's source
		j := c.RandN(i + 1)
		out[i], out[j] = out[j], out[i]
	}
	return out[:min(len(out), p.MaxFallbacks+1)]
}

func newPicker(typ string) Factory {
	return func(name string, raw json.RawMessage, _ *Handle) (Plugin, error) {
		n, err := decodePickerParams(raw)
		if err != nil {
			return nil, err
		}
		if typ == TypeRandomPicker {
			return &RandomPicker{NewTypedName(typ, name), n}, nil
		}
		return &MaxScorePicker{NewTypedName(typ, name), n}, nil
	}
}
