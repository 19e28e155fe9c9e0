package picker

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
)

// Built-in plugin type names, as a config file names them.
const (
	TypeSingleProfileHandler = "single-profile-handler"
	TypeLeastRequestScorer   = "least-request-scorer"
	TypePrefixCacheScorer    = "prefix-cache-scorer"
	TypeMaxScorePicker       = "max-score-picker"
	TypeRandomPicker         = "random-picker"
	TypeDecodeRoleFilter     = "decode-role-filter"
)

type named struct{ typ, name string }

func (n named) Type() string { return n.typ }
func (n named) Name() string { return n.name }

func nameOr(name, typ string) named {
	if name == "" {
		name = typ
	}
	return named{typ, name}
}

// SingleProfileHandler runs the one profile it is given; the result is that profile's ranking.
type SingleProfileHandler struct{ named }

// NewSingleProfileHandler returns the handler.
func NewSingleProfileHandler() *SingleProfileHandler {
	return &SingleProfileHandler{nameOr("", TypeSingleProfileHandler)}
}

// Next implements ProfileHandler.
func (h *SingleProfileHandler) Next(_ context.Context, _ *Cycle, profiles []*Profile, done map[string]*ProfileResult) []*Profile {
	if len(done) > 0 || len(profiles) == 0 {
		return nil
	}
	return profiles[:1]
}

// Result implements ProfileHandler.
func (h *SingleProfileHandler) Result(_ context.Context, _ *Cycle, done map[string]*ProfileResult) ([]*pool.Endpoint, []*pool.Endpoint, error) {
	for _, r := range done {
		return r.Ranked, nil, nil
	}
	return nil, nil, fmt.Errorf("no profile ran")
}

// DecodeRoleFilter drops prefill-only endpoints: a non-PD strategy must never send a whole
// request to a pod that only runs prefill. When every candidate is prefill it keeps them
// (a misconfigured pool still answers rather than failing closed).
type DecodeRoleFilter struct{ named }

// Filter implements Filter.
func (f *DecodeRoleFilter) Filter(_ context.Context, _ *Cycle, eps []*pool.Endpoint) []*pool.Endpoint {
	out := eps[:0:0]
	for _, e := range eps {
		if e.Role != pool.RolePrefill {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return eps
	}
	return out
}

// LeastRequestScorer scores 1 − inFlight/maxInFlight over the candidates (all 1 when idle).
type LeastRequestScorer struct {
	named
	deps *Deps
}

// Score implements Scorer.
func (s *LeastRequestScorer) Score(_ context.Context, _ *Cycle, eps []*pool.Endpoint, out []float64) {
	var hi int64
	for i, e := range eps {
		n := s.deps.Running.InFlight(e.Key())
		out[i] = float64(n)
		hi = max(hi, n)
	}
	for i := range out {
		if hi == 0 {
			out[i] = 1
		} else {
			out[i] = 1 - out[i]/float64(hi)
		}
	}
}

// PrefixCacheScorer scores each endpoint's prefix match percentage / 100 from the prefix
// index (matches below MinMatchPct count as 0) and, as a PostPick, warms the index with
// the chosen destination.
type PrefixCacheScorer struct {
	named
	deps        *Deps
	BlockTokens int
	MinMatchPct float64
	// ProfileMinMatch takes the threshold from the request's resolved settings (the gateway's
	// AIBRIX_MIN_MATCH_PCT with the profile's routingConfig.pd.minMatchPct applied) instead of
	// MinMatchPct. The built-in prefix-cache strategy sets it; a --config-file plugin with its
	// own minMatchPct parameter does not.
	ProfileMinMatch bool
}

const stateHashes = "prefix.hashes"

// PromptHashes returns the request's prompt block hashes, computing them once per cycle.
func PromptHashes(c *Cycle, blockTokens int) []uint64 {
	key := stateHashes + "/" + strconv.Itoa(blockTokens)
	if v, ok := c.State.Read(key); ok {
		return v.([]uint64)
	}
	h := prefix.Hash(nil, c.Req.Prompt, prefix.BlockBytes(blockTokens))
	c.State.Write(key, h)
	return h
}

// Score implements Scorer.
func (s *PrefixCacheScorer) Score(_ context.Context, c *Cycle, eps []*pool.Endpoint, out []float64) {
	hashes := PromptHashes(c, s.BlockTokens)
	if len(hashes) == 0 || s.deps.Prefix == nil {
		return
	}
	idx := make(map[string]int, len(eps))
	for i, e := range eps {
		idx[e.Key()] = i
	}
	minPct := s.MinMatchPct
	if s.ProfileMinMatch {
		minPct = c.Resolved.PD.MinMatchPct
	}
	s.deps.Prefix.Match(c.Req.Model, hashes, func(key string, pct float64) {
		if i, ok := idx[key]; ok && pct >= minPct {
			out[i] = pct / 100
		}
	})
}

// PostPick implements PostPick: the destination now holds the prompt's prefix.
func (s *PrefixCacheScorer) PostPick(_ context.Context, c *Cycle, d *Decision) {
	if len(d.Destination) > 0 {
		s.deps.WarmPrefix(c.Req.Model, PromptHashes(c, s.BlockTokens), d.Destination[0].Key())
	}
}

// MaxScorePicker ranks by score, highest first, ties at random, keeping MaxFallbacks fallbacks.
type MaxScorePicker struct {
	named
	MaxFallbacks int
}

// Pick implements Picker.
func (p *MaxScorePicker) Pick(_ context.Context, c *Cycle, scored []ScoredEndpoint) []*pool.Endpoint {
	type ranked struct {
		ScoredEndpoint
		tie int
	}
	rs := make([]ranked, len(scored))
	for i, s := range scored {
		rs[i] = ranked{s, c.randN(1 << 30)}
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
	named
	MaxFallbacks int
}

// Pick implements Picker.
func (p *RandomPicker) Pick(_ context.Context, c *Cycle, scored []ScoredEndpoint) []*pool.Endpoint {
	out := make([]*pool.Endpoint, len(scored))
	for i, s := range scored {
		out[i] = s.Endpoint
	}
	for i := len(out) - 1; i > 0; i-- { // Fisher–Yates from the cycle's source
		j := c.randN(i + 1)
		out[i], out[j] = out[j], out[i]
	}
	return out[:min(len(out), p.MaxFallbacks+1)]
}

// pluginParams are the parameters the built-in plugins accept from a config file.
type pluginParams struct {
	MaxFallbacks *int     `json:"maxFallbacks"`
	BlockSize    *int     `json:"blockSize"`
	MinMatchPct  *float64 `json:"minMatchPct"`
}

func decodeParams(typ string, raw json.RawMessage) (pluginParams, error) {
	var p pluginParams
	if len(raw) == 0 || string(raw) == "null" {
		return p, nil
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return p, fmt.Errorf("plugin type %q: parameters: %w", typ, err)
	}
	if p.MaxFallbacks != nil && *p.MaxFallbacks < 0 {
		return p, fmt.Errorf("plugin type %q: maxFallbacks=%d: must be >= 0", typ, *p.MaxFallbacks)
	}
	if p.BlockSize != nil && *p.BlockSize < 1 {
		return p, fmt.Errorf("plugin type %q: blockSize=%d: must be >= 1", typ, *p.BlockSize)
	}
	if p.MinMatchPct != nil && (*p.MinMatchPct < 0 || *p.MinMatchPct > 100) {
		return p, fmt.Errorf("plugin type %q: minMatchPct=%v: must be in [0, 100]", typ, *p.MinMatchPct)
	}
	return p, nil
}

func intOr(p *int, def int) int {
	if p == nil {
		return def
	}
	return *p
}

// DefaultFallbacks is how many fallback endpoints follow the primary unless configured.
const DefaultFallbacks = 2

func registerBuiltins(r *Registry) {
	r.Register(TypeSingleProfileHandler, func(name string, raw json.RawMessage, _ *Deps) (Plugin, error) {
		if _, err := decodeParams(TypeSingleProfileHandler, raw); err != nil {
			return nil, err
		}
		return &SingleProfileHandler{nameOr(name, TypeSingleProfileHandler)}, nil
	})
	r.Register(TypeDecodeRoleFilter, func(name string, raw json.RawMessage, _ *Deps) (Plugin, error) {
		if _, err := decodeParams(TypeDecodeRoleFilter, raw); err != nil {
			return nil, err
		}
		return &DecodeRoleFilter{nameOr(name, TypeDecodeRoleFilter)}, nil
	})
	r.Register(TypeLeastRequestScorer, func(name string, raw json.RawMessage, d *Deps) (Plugin, error) {
		if _, err := decodeParams(TypeLeastRequestScorer, raw); err != nil {
			return nil, err
		}
		return &LeastRequestScorer{nameOr(name, TypeLeastRequestScorer), d}, nil
	})
	r.Register(TypePrefixCacheScorer, func(name string, raw json.RawMessage, d *Deps) (Plugin, error) {
		p, err := decodeParams(TypePrefixCacheScorer, raw)
		if err != nil {
			return nil, err
		}
		s := &PrefixCacheScorer{named: nameOr(name, TypePrefixCacheScorer), deps: d, BlockTokens: intOr(p.BlockSize, 128)}
		if p.MinMatchPct != nil {
			s.MinMatchPct = *p.MinMatchPct
		}
		return s, nil
	})
	r.Register(TypeMaxScorePicker, func(name string, raw json.RawMessage, _ *Deps) (Plugin, error) {
		p, err := decodeParams(TypeMaxScorePicker, raw)
		if err != nil {
			return nil, err
		}
		return &MaxScorePicker{nameOr(name, TypeMaxScorePicker), intOr(p.MaxFallbacks, DefaultFallbacks)}, nil
	})
	r.Register(TypeRandomPicker, func(name string, raw json.RawMessage, _ *Deps) (Plugin, error) {
		p, err := decodeParams(TypeRandomPicker, raw)
		if err != nil {
			return nil, err
		}
		return &RandomPicker{nameOr(name, TypeRandomPicker), intOr(p.MaxFallbacks, DefaultFallbacks)}, nil
	})
}
