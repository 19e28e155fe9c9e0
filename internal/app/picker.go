package app

import (
	"fmt"
	"slices"
	"sync"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/advisor"
	"github.com/tandem-epp/tandem/internal/bucketserve"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/prefix"
	"github.com/tandem-epp/tandem/internal/proof"
)

// PickerOptions say how to assemble the picker.
type PickerOptions struct {
	Clock    load.Clock // nil: the system clock
	Gateway  config.Gateway
	File     *config.File // --config-file, may be nil
	Registry *picker.Registry
	Reporter config.Reporter
	Logger   logr.Logger
	// Gauges receive the token-load ledgers' gauges; BucketMetrics the bucket-serve metrics;
	// Predictions each TTFT prediction of the latency models with its outcome.
	Gauges        ledger.Gauges
	BucketMetrics bucketserve.Metrics
	Predictions   latency.Observer
	// Objectives resolves InferenceObjectives by name (sheddable requests); may be nil.
	Objectives pd.Objectives
	// Health is passive health: every strategy picks among the candidates it admits. Nil
	// admits every candidate.
	Health *health.Detector
	// Transfer is the transfer proof's lenient policy: decode pods it holds are left out of
	// picks while the pool can do without them. Nil holds none.
	Transfer *proof.Gate
	// Outcomes, when set, is the recorder of the routed requests (Deps.Outcomes) the ext_proc
	// server and passive health share; nil: a fresh one.
	Outcomes *outcome.Recorder
}

// Picker is the assembled picker: the router the ext_proc server calls, its dependencies and
// the token-load ledgers (whose janitor and shared ledger the app runs).
type Picker struct {
	Router *picker.Router
	Deps   *picker.Deps
	Tokens *pd.TokenLoad
	// Cascade is the PD strategy (its prefill and pending-decode trackers).
	Cascade *pd.Cascade
	// Models are the online latency models (fed by Deps.Outcomes) of pd-predictive.
	Models *latency.Models
	// Advisor is the P:D ratio advisor (fed by Deps.Outcomes, pricing with Models).
	Advisor *advisor.Advisor
	// Warnings are the config file's problems that did not stop it from loading.
	Warnings []string

	mu       sync.Mutex // serialises reloads
	builtin  []picker.Strategy
	registry *picker.Registry
	reporter config.Reporter
	gateway  config.Gateway
	resolver *config.Resolver
	names    config.Names
}

// BuildPicker assembles the PD cascade (with the token-load policies and adaptive bucket
// serving), the simple strategies and the --config-file's strategies behind one router,
// over fresh dependencies that all read o.Clock.
func BuildPicker(o PickerOptions) (*Picker, error) {
	clock := o.Clock
	if clock == nil {
		clock = load.SystemClock{}
	}
	if o.Registry == nil {
		o.Registry = picker.NewRegistry()
	}
	gw := o.Gateway
	deps := picker.NewDeps(clock, gw.PD.PrefixCache)
	if o.Outcomes != nil {
		deps.Outcomes = o.Outcomes
	}
	if o.Transfer != nil {
		deps.OnForget(o.Transfer.Forget) // decode pods that left lose their proof state
	}
	deps.Warmer = prefix.NewWarmer(deps.Prefix, 1024)
	tokens := pd.NewTokenLoad(gw.PD, ledger.Options{Clock: clock, Gauges: o.Gauges, Logger: o.Logger.WithName("token-load")})
	models := latency.New(latency.Options{Clock: clock, Samples: deps.Metrics.Get, Observer: o.Predictions})
	deps.Outcomes.Subscribe(models)
	adv := advisor.New(advisor.Options{Clock: clock, Models: models, Samples: deps.Metrics.Get, Window: gw.AdvisorWindow,
		TTFT: gw.PD.SLOTTFT, TPOT: gw.PD.SLOTPOT})
	deps.Outcomes.Subscribe(adv)
	cascade := pd.New(pd.Options{Deps: deps, Gateway: gw.PD, Logger: o.Logger.WithName("pd"), Objectives: o.Objectives,
		Preference: &pd.BucketServe{Planner: bucketserve.New(clock, o.BucketMetrics)}, Models: models, TokenLoad: tokens})
	pd.RegisterPlugins(o.Registry, cascade)
	p := &Picker{Deps: deps, Tokens: tokens, Cascade: cascade, Models: models, Advisor: adv, builtin: pd.Strategies(cascade, deps, gw.PD),
		registry: o.Registry, reporter: o.Reporter}
	table, warnings, err := p.routes(o.File, gw)
	if err != nil {
		return nil, err
	}
	p.Warnings = warnings
	table.Logger, table.Health, table.Transfer = o.Logger.WithName("picker"), o.Health, o.Transfer
	if p.Router, err = picker.NewRouter(table); err != nil {
		return nil, err
	}
	return p, nil
}

// routes builds the router's table for a config file and gateway settings: the built-in
// strategies, the file's, and a resolver (the current one when the names and settings are
// unchanged, so the pods' last good annotations are kept).
func (p *Picker) routes(f *config.File, gw config.Gateway) (picker.RouterOptions, []string, error) {
	names := make([]string, 0, len(p.builtin)+4)
	for _, s := range p.builtin {
		names = append(names, s.Name())
	}
	fromFile, err := picker.FromFile(f, p.registry, p.Deps, names)
	if err != nil {
		return picker.RouterOptions{}, nil, err
	}
	strategies := append(slices.Clone(p.builtin), fromFile.Strategies...)
	for _, s := range fromFile.Strategies {
		names = append(names, s.Name())
	}
	prefill, decode := p.Cascade.Policies().Names()
	accepted := config.Names{Strategies: names, PrefillPolicies: prefill, DecodePolicies: decode}
	resolver := p.resolver
	if resolver == nil || gw != p.gateway || !equalNames(accepted, p.names) {
		if resolver, err = config.NewResolver(gw, config.Options{Names: accepted, Reporter: p.reporter}); err != nil {
			return picker.RouterOptions{}, nil, fmt.Errorf("configuration: %w", err)
		}
	}
	p.resolver, p.gateway, p.names = resolver, gw, accepted
	return picker.RouterOptions{Resolver: resolver, Strategies: strategies, Default: fromFile.Default}, fromFile.Warnings, nil
}

// Reload applies a changed --config-file (its plugins, profiles and gateway: section, with
// the environment over it): everything is built first and swapped into the router at once,
// so a request routes wholly on the old configuration or wholly on the new. On an error the
// picker keeps the configuration it has. It returns the file's warnings.
func (p *Picker) Reload(f *config.File, gw config.Gateway) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	oldResolver, oldGateway, oldNames := p.resolver, p.gateway, p.names
	table, warnings, err := p.routes(f, gw)
	if err == nil {
		err = p.Router.Swap(table)
	}
	if err != nil {
		p.resolver, p.gateway, p.names = oldResolver, oldGateway, oldNames
		return nil, err
	}
	return warnings, nil
}

func equalNames(a, b config.Names) bool {
	return slices.Equal(a.Strategies, b.Strategies) && slices.Equal(a.PrefillPolicies, b.PrefillPolicies) &&
		slices.Equal(a.DecodePolicies, b.DecodePolicies)
}

// BuildRouter is BuildPicker on the system clock, for callers that need only the router.
func BuildRouter(gw config.Gateway, cfgFile *config.File, registry *picker.Registry, rep config.Reporter, log logr.Logger) (*picker.Router, *picker.Deps, error) {
	return BuildRouterWithClock(load.SystemClock{}, gw, cfgFile, registry, rep, log)
}

// BuildRouterWithClock is BuildRouter with every time-keeping dependency (trackers, rates,
// prefix index, ledgers) reading clock: a virtual-time simulation (bench/quality) injects
// a load.ManualClock and drives the production router in simulated time.
func BuildRouterWithClock(clock load.Clock, gw config.Gateway, cfgFile *config.File, registry *picker.Registry, rep config.Reporter, log logr.Logger) (*picker.Router, *picker.Deps, error) {
	p, err := BuildPicker(PickerOptions{Clock: clock, Gateway: gw, File: cfgFile, Registry: registry, Reporter: rep, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	return p.Router, p.Deps, nil
}
