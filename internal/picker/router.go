package picker

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// Router is the Scheduler the ext_proc server calls: it resolves the request's strategy
// and profile, runs the strategy and echoes the strategy used. Decisions are counted by the
// ext_proc server's observer (tandem_decisions_total), from Decision.Strategy/Outcome/Step.
type Router struct {
	resolver   Resolver
	strategies map[string]Strategy
	names      []string
	log        logr.Logger
}

// RouterOptions configure a Router.
type RouterOptions struct {
	Resolver   Resolver
	Strategies []Strategy
	// Logger is used when the request context carries none.
	Logger logr.Logger
}

// ResponseHeaderStrategy echoes the strategy used.
const ResponseHeaderStrategy = wire.HeaderRoutingStrategy

// NewRouter builds a router. Strategy names must be unique.
func NewRouter(o RouterOptions) (*Router, error) {
	if o.Resolver == nil {
		return nil, errorf("router: a Resolver is required")
	}
	r := &Router{resolver: o.Resolver, strategies: map[string]Strategy{}, log: o.Logger}
	for _, s := range o.Strategies {
		if _, dup := r.strategies[s.Name()]; dup {
			return nil, errorf("router: strategy %q registered twice", s.Name())
		}
		r.strategies[s.Name()] = s
		r.names = append(r.names, s.Name())
	}
	slices.Sort(r.names)
	return r, nil
}

// Strategies lists the strategy names this router runs, sorted.
func (r *Router) Strategies() []string { return slices.Clone(r.names) }

// Schedule implements Scheduler.
func (r *Router) Schedule(ctx context.Context, req *request.Request, snap *pool.Snapshot, cands []*pool.Endpoint) (*Decision, error) {
	res, err := r.resolver.Resolve(req.Headers, req.Model, snap)
	if err != nil {
		return nil, apierror.From(err)
	}
	name := res.Strategy
	if name == "" {
		name = StrategyLeastRequest
		if hasPDRoles(cands) {
			name = "pd"
		}
	}
	s := r.strategies[name]
	if s == nil {
		return nil, apierror.BadRequest("unknown_strategy", wire.HeaderRoutingStrategy,
			"unknown routing strategy %q (from the %s); valid strategies: %s", name, sourceOf(res.StrategySource), strings.Join(r.names, ", "))
	}
	profile := res.ProfileName
	c := &Cycle{Req: req, Snap: snap, Candidates: cands, Resolved: res, State: &CycleState{},
		PodRouting: func(e *pool.Endpoint) config.RoutingConfig { return r.resolver.PodRouting(e, profile) }}
	d, err := s.Pick(ctx, c)
	log := r.logger(ctx)
	if err != nil {
		ae := apierror.From(err)
		log.V(1).Info("no decision", "request", req.ID, "strategy", name, "error", ae.Error())
		return nil, ae
	}
	d.Strategy = name
	if d.Handoff == "" {
		d.Handoff, d.PD = res.Handoff, res.PD
	}
	if d.ResponseHeaders == nil {
		d.ResponseHeaders = map[string]string{}
	}
	d.ResponseHeaders[ResponseHeaderStrategy] = name
	if log.V(1).Enabled() {
		trace, _ := json.Marshal(d.Trace)
		log.V(1).Info("decision", "request", req.ID, "strategy", name, "source", res.StrategySource,
			"profile", res.ProfileName, "outcome", d.Outcome, "step", d.Step,
			"destination", hostPorts(d.Destination), "prefill", hostPorts(d.Prefill), "trace", string(trace))
	}
	return d, nil
}

func (r *Router) logger(ctx context.Context) logr.Logger {
	if l, err := logr.FromContext(ctx); err == nil {
		return l
	}
	return r.log
}

func sourceOf(s config.StrategySource) string {
	switch s {
	case config.SourceLocked:
		return "model config's lockedRoutingStrategy"
	case config.SourceHeader:
		return wire.HeaderRoutingStrategy + " header"
	case config.SourceProfile:
		return "profile's routingStrategy"
	}
	return "gateway default (ROUTING_ALGORITHM)"
}

func hasPDRoles(eps []*pool.Endpoint) bool {
	for _, e := range eps {
		if e.Role == pool.RolePrefill || e.Role == pool.RoleDecode {
			return true
		}
	}
	return false
}

func hostPorts(eps []*pool.Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.HostPort()
	}
	return out
}
