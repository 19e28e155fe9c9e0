package config

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// StrategySource says which layer chose a request's strategy.
type StrategySource string

const (
	SourceLocked  StrategySource = "locked"  // the model config's lockedRoutingStrategy
	SourceHeader  StrategySource = "header"  // the routing-strategy request header
	SourceProfile StrategySource = "profile" // the profile's routingStrategy
	SourceGateway StrategySource = "gateway" // ROUTING_ALGORITHM
)

// Resolved is the configuration one request routes with.
type Resolved struct {
	// Strategy is the strategy to run; empty (only from an unset ROUTING_ALGORITHM) lets the
	// picker choose by the candidates' roles.
	Strategy       string
	StrategySource StrategySource
	// ProfileName is the profile used: the config-profile header if the model config has it,
	// else defaultProfile, else "default". Pass it to PodRouting.
	ProfileName string
	// RequestedProfile is the config-profile header as sent (trimmed). PodRouting falls back
	// to each pod's own default profile when the pod lacks it.
	RequestedProfile string
	// Auto says ProfileName was chosen by config-profile: auto (the response echoes it in
	// x-aibrix-config-profile, as AIBrix does).
	Auto bool
	// ConfigPod is the pod key the model-wide config was read from; "" when no pod has one.
	ConfigPod string
	// Routing is the profile's routingConfig in the model-wide config (zero when none).
	Routing RoutingConfig
	// PD is the gateway PD configuration with the profile's routingConfig fields and
	// routingConfig.pd overrides applied. The three fields below repeat it for convenience.
	PD                 PD
	PrefillScorePolicy string
	DecodeScorePolicy  string
	Handoff            string
}

// Options are what a Resolver needs from the rest of Tandem.
type Options struct {
	// Names are the strategies and policies the registries hold; zero fields take DefaultNames.
	Names Names
	// Reporter receives bad annotations; nil discards them (tests only: wire it in production).
	Reporter Reporter
}

// Resolver answers, per request, which strategy, profile and PD settings apply, and per pod,
// which routingConfig applies. It never fails routing on bad configuration: only an unknown
// strategy in the request header is an error (a 400 listing the valid ones).
type Resolver struct {
	gw         Gateway
	names      Names
	strategies map[string]bool
	valid      string // the valid strategies, for the 400 message
	profiles   *Profiles

	mu    sync.Mutex // serialises index builds
	index atomic.Pointer[snapIndex]
}

// snapIndex remembers, for one snapshot, the endpoint each model reads its config from.
type snapIndex struct {
	snap    *pool.Snapshot
	byModel map[string]*pool.Endpoint // model -> first endpoint with a config (nil: none)
	any     *pool.Endpoint            // first endpoint with a config in the whole pool
	// views is every endpoint's config (nil: none): a plain map, cheaper to read than the
	// Profiles cache on the per-endpoint path.
	views   map[*pool.Endpoint]*modelView
	podKeys map[*pool.Endpoint]string // pod keys of the config pods, computed once
}

// NewResolver checks the gateway configuration against the registries (the default strategy
// and score policies must exist) and returns a resolver.
func NewResolver(gw Gateway, opts Options) (*Resolver, error) {
	names := opts.Names.withDefaults()
	r := &Resolver{gw: gw, names: names, strategies: map[string]bool{}}
	sorted := slices.Clone(names.Strategies)
	slices.Sort(sorted)
	for _, s := range sorted {
		r.strategies[s] = true
	}
	r.valid = strings.Join(sorted, strategyListSeparator)
	var errs Errors
	check := func(name, value string, valid []string) {
		if !slices.Contains(valid, value) {
			errs = append(errs, &Problem{Field: name, Value: value, Rule: oneOf(valid)})
		}
	}
	if gw.DefaultStrategy != "" {
		check("ROUTING_ALGORITHM", gw.DefaultStrategy, sorted)
	}
	check("AIBRIX_PREFILL_SCORE_POLICY", gw.PD.PrefillScorePolicy, names.PrefillPolicies)
	check("AIBRIX_DECODE_SCORE_POLICY", gw.PD.DecodeScorePolicy, names.DecodePolicies)
	if err := errs.orNil(); err != nil {
		return nil, err
	}
	r.profiles = NewProfiles(gw, names, opts.Reporter)
	return r, nil
}

// Gateway returns the gateway configuration the resolver was built with.
func (r *Resolver) Gateway() Gateway { return r.gw }

// Profiles returns the per-pod profile cache.
func (r *Resolver) Profiles() *Profiles { return r.profiles }

// ResolveEndpoints works out the configuration of a request whose model is served by endpoints (in
// stable order). headers are keyed in lower case. The model-wide config comes from the first
// endpoint with a usable model.aibrix.ai/config annotation.
func (r *Resolver) ResolveEndpoints(headers map[string]string, endpoints []*pool.Endpoint) (Resolved, error) {
	return r.ResolveEndpointsFor(headers, endpoints, Features{})
}

// ResolveEndpointsFor is ResolveEndpoints with the request features config-profile: auto reads.
func (r *Resolver) ResolveEndpointsFor(headers map[string]string, endpoints []*pool.Endpoint, f Features) (Resolved, error) {
	for _, e := range endpoints {
		if v := r.profiles.view(e); v != nil {
			return r.resolve(headers, v, e.PodKey(), f)
		}
	}
	return r.resolve(headers, nil, "", f)
}

// Resolve is ResolveEndpoints for the endpoints of model in snap: those labelled with
// model.aibrix.ai/name = model, or every endpoint when none is (a pool serving one model
// without the label). The choice of config pod is memoised per snapshot, and a newer snapshot
// drops the cached state of endpoints that left the pool.
func (r *Resolver) Resolve(headers map[string]string, model string, snap *pool.Snapshot) (Resolved, error) {
	return r.ResolveRequest(headers, model, snap, Features{})
}

// ResolveRequest is Resolve with the request features config-profile: auto reads.
func (r *Resolver) ResolveRequest(headers map[string]string, model string, snap *pool.Snapshot, f Features) (Resolved, error) {
	idx := r.indexFor(snap)
	src, ok := idx.byModel[model]
	if !ok {
		src = idx.any
	}
	if src == nil {
		return r.resolve(headers, nil, "", f)
	}
	return r.resolve(headers, idx.views[src], idx.podKeys[src], f)
}

// PodRouting returns the routingConfig an endpoint declares for the profile (see
// Profiles.PodRouting). Cheap: one lock-free lookup after the endpoint's first call.
func (r *Resolver) PodRouting(e *pool.Endpoint, profile string) RoutingConfig {
	if idx := r.index.Load(); idx != nil {
		if v, ok := idx.views[e]; ok {
			return v.routing(profile)
		}
	}
	return r.profiles.PodRouting(e, profile)
}

func (r *Resolver) resolve(headers map[string]string, v *modelView, configPod string, f Features) (Resolved, error) {
	out := Resolved{RequestedProfile: strings.TrimSpace(headers[wire.HeaderConfigProfile])}
	var pv *profileView
	if v != nil {
		out.ConfigPod = configPod
		name := out.RequestedProfile
		if isAuto(name) {
			name, out.Auto = v.autoProfile(f), true
			out.RequestedProfile = name // each pod resolves its own profile of that name
		}
		out.ProfileName, pv = v.profile(name)
	} else {
		out.ProfileName = DefaultProfileName
	}
	header := strings.ToLower(strings.TrimSpace(headers[wire.HeaderRoutingStrategy]))
	switch {
	case v != nil && v.locked != "":
		out.Strategy, out.StrategySource = v.locked, SourceLocked
	case header != "":
		if !r.strategies[header] {
			return Resolved{}, apierror.BadRequest("bad_strategy", wire.HeaderRoutingStrategy,
				"unknown routing strategy %q in the %s header; valid strategies: %s", header, wire.HeaderRoutingStrategy, r.valid)
		}
		out.Strategy, out.StrategySource = header, SourceHeader
	case pv != nil && pv.strategy != "":
		out.Strategy, out.StrategySource = pv.strategy, SourceProfile
	default:
		out.Strategy, out.StrategySource = r.gw.DefaultStrategy, SourceGateway
	}
	if pv != nil {
		out.Routing = pv.routing
		out.PD = pv.pd
	} else {
		out.PD = r.gw.PD
	}
	out.PrefillScorePolicy = out.PD.PrefillScorePolicy
	out.DecodeScorePolicy = out.PD.DecodeScorePolicy
	out.Handoff = out.PD.Handoff
	return out, nil
}

// indexFor returns the config-pod index of snap, building it (and pruning the cache) the first
// time a snapshot newer than the indexed one is seen. An older snapshot gets a throwaway index.
func (r *Resolver) indexFor(snap *pool.Snapshot) *snapIndex {
	if idx := r.index.Load(); idx != nil && idx.snap == snap {
		return idx
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.index.Load()
	if cur != nil && cur.snap == snap {
		return cur
	}
	idx := &snapIndex{snap: snap, byModel: map[string]*pool.Endpoint{},
		views: make(map[*pool.Endpoint]*modelView, len(snap.Endpoints)), podKeys: map[*pool.Endpoint]string{}}
	for _, e := range snap.Endpoints {
		v := r.profiles.view(e) // also reports bad annotations as soon as a snapshot carries them
		idx.views[e] = v
		if v != nil {
			idx.podKeys[e] = e.PodKey()
		}
		if first, seen := idx.byModel[e.Model]; !seen || (first == nil && v != nil) {
			idx.byModel[e.Model] = nil
			if v != nil {
				idx.byModel[e.Model] = e
			}
		}
		if idx.any == nil && v != nil {
			idx.any = e
		}
	}
	if cur == nil || snap.Version >= cur.snap.Version {
		r.profiles.retain(snap.Endpoints)
		r.index.Store(idx)
	}
	return idx
}

// String describes the resolution for logs.
func (r Resolved) String() string {
	return fmt.Sprintf("strategy=%s (%s) profile=%s config-pod=%q", r.Strategy, r.StrategySource, r.ProfileName, r.ConfigPod)
}
