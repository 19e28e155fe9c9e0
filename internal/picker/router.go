package picker

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/proof"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// Router is the Scheduler the ext_proc server calls: it resolves the request's strategy
// and profile, runs the strategy and echoes the strategy used. Decisions are counted by the
// ext_proc server's observer (tandem_decisions_total), from Decision.Strategy/Outcome/Step.
// Its routing (resolver, strategies, default) is swapped atomically by Swap.
type Router struct {
	routes   atomic.Pointer[routes]
	health   *health.Detector
	transfer *proof.Gate
	log      logr.Logger
}

// routes is one consistent routing table: a request runs wholly on the one it loaded.
type routes struct {
	resolver   Resolver
	strategies map[string]Strategy
	names      []string
	fallback   string
}

// RouterOptions configure a Router.
type RouterOptions struct {
	Resolver   Resolver
	Strategies []Strategy
	// Default is the strategy a request runs when neither its model config, the
	// routing-strategy header nor ROUTING_ALGORITHM names one: the --config-file's scheduling,
	// as GIE and llm-d run it. Empty: pd when the candidates carry prefill/decode roles, else
	// least-request.
	Default string
	// Logger is used when the request context carries none.
	Logger logr.Logger
	// Health is passive health: every strategy picks among the candidates it admits (see
	// Schedule). Nil admits every candidate. Swap keeps the router's.
	Health *health.Detector
	// Transfer is the transfer proof's lenient policy: decode pods it holds are candidates
	// only when the pick fails without them. Nil holds none. Swap keeps the router's.
	Transfer *proof.Gate
}

// ResponseHeaderStrategy echoes the strategy used: the one the request resolved to, unless
// that strategy handed the request to another and set the header to it.
const ResponseHeaderStrategy = wire.HeaderRoutingStrategy

// NewRouter builds a router. Strategy names must be unique.
func NewRouter(o RouterOptions) (*Router, error) {
	r := &Router{log: o.Logger, health: o.Health, transfer: o.Transfer}
	if err := r.Swap(o); err != nil {
		return nil, err
	}
	return r, nil
}

// Swap replaces the resolver, the strategies and the default at once (a --config-file
// reload); a request already routing finishes with the table it started with. On an error
// the router keeps its table.
func (r *Router) Swap(o RouterOptions) error {
	if o.Resolver == nil {
		return errorf("router: a Resolver is required")
	}
	t := &routes{resolver: o.Resolver, strategies: map[string]Strategy{}, fallback: o.Default}
	for _, s := range o.Strategies {
		if _, dup := t.strategies[s.Name()]; dup {
			return errorf("router: strategy %q registered twice", s.Name())
		}
		t.strategies[s.Name()] = s
		t.names = append(t.names, s.Name())
	}
	if o.Default != "" && t.strategies[o.Default] == nil {
		return errorf("router: default strategy %q is not registered", o.Default)
	}
	slices.Sort(t.names)
	r.routes.Store(t)
	return nil
}

// Strategies lists the strategy names this router runs, sorted.
func (r *Router) Strategies() []string { return slices.Clone(r.routes.Load().names) }

// Default is the strategy requests run when nothing names one ("" : chosen by roles).
func (r *Router) Default() string { return r.routes.Load().fallback }

// Strategy returns the strategy called name, or nil.
func (r *Router) Strategy(name string) Strategy { return r.routes.Load().strategies[name] }

// Schedule implements Scheduler.
func (r *Router) Schedule(ctx context.Context, req *request.Request, snap *pool.Snapshot, cands []*pool.Endpoint) (*Decision, error) {
	t := r.routes.Load()
	res, err := t.resolver.ResolveRequest(req.Headers, req.Model, snap,
		config.Features{Prompt: req.PromptLength, MaxTokens: req.MaxTokens, HasMaxTokens: req.HasMaxTokens})
	if err != nil {
		return nil, apierror.From(err)
	}
	name := res.Strategy
	if name == "" {
		name = t.fallback
	}
	if name == "" {
		name = StrategyLeastRequest
		if hasPDRoles(cands) {
			name = config.StrategyPD
		}
	}
	s := t.strategies[name]
	if s == nil {
		return nil, apierror.BadRequest("unknown_strategy", wire.HeaderRoutingStrategy,
			"unknown routing strategy %q (from the %s); valid strategies: %s", name, sourceOf(res.StrategySource), strings.Join(t.names, ", "))
	}
	profile := res.ProfileName
	resolver := t.resolver
	pick := func(eps []*pool.Endpoint) (*Decision, error) {
		c := &Cycle{Req: req, Snap: snap, Candidates: eps, Resolved: res, State: &CycleState{},
			PodRouting: func(e *pool.Endpoint) config.RoutingConfig { return resolver.PodRouting(e, profile) }}
		return s.Pick(ctx, c)
	}
	d, err := r.pickProven(cands, pick)
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
	if d.ResponseHeaders[ResponseHeaderStrategy] == "" {
		// The strategy that ran: a strategy that hands a request to another (pd sends
		// non-completion requests to least-request) names that one itself.
		d.ResponseHeaders[ResponseHeaderStrategy] = name
	}
	if res.Auto {
		d.ResponseHeaders[wire.HeaderAIBrixConfigProfile] = res.ProfileName
	}
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
