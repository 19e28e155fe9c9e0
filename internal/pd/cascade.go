package pd

import (
	"context"
	"math/rand/v2"
	"sync"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/wire"
)

// StrategyName is the routing-strategy value of the cascade.
const StrategyName = config.StrategyPD

// HeaderPrefillerHostPort carries the prefill target to a decode-side sidecar (llm-d's
// routing sidecar reads it); the name is package wire's.
const HeaderPrefillerHostPort = wire.HeaderPrefillerHostPort

// RolesetPreference is the extension point of step 2b, adaptive bucket serving: after the
// fast paths, it may name the roleset a request's prompt length is banded to. The cascade
// narrows both sides to it only when that roleset still has prefill and decode candidates;
// otherwise routing proceeds as if it had not answered. It runs inside the selection
// critical section and must be quick.
type RolesetPreference interface {
	Prefer(cy *picker.Cycle, rolesets []string) (roleset string, ok bool)
}

// Steps name what decided a request, a bounded set usable as a metric label.
const (
	StepPair              = "pair"                  // steps 3–5 scored the pair
	StepPrefillImbalance  = "prefill_imbalance"     // step 1 chose the prefill pod
	StepDecodeRequests    = "decode_request_spread" // step 2, first check
	StepDecodeThroughput  = "decode_throughput_spread"
	StepDecodeDrain       = "decode_drain_ratio"
	StepCombinedNoBucket  = "combined_no_bucket_match" // step 0: no complete roleset covers the prompt
	StepCombinedOverflow  = "combined_overflow"        // step 0: PD saturated, a combined pod idle
	StepCombinedNoRoleset = "combined_no_roleset"      // no complete roleset at all
	StepNonInference      = "non_inference"            // not a completion: least-request, no prefill
	StepBucketServe       = "bucket_serve"             // step 2b narrowed the pair to a banded roleset
	stepSeparator         = "+"
	combinedLowLoadScore  = 0.25 // a combined pod scoring below this is idle
	pdHighLoadScore       = 1.0  // a PD pod scoring above this is saturated
	combinedDrainFloor    = 0.01 // requests/s; see combinedScore
	drainRatioFloor       = 0.1  // requests/s; the seed's epsilon in the drain-ratio check
	decodeMaxScoreFloor   = 0.01
	maxTracedRolesets     = 8
	defaultFallbacks      = picker.DefaultFallbacks
	coldStartBaseScore    = 1.0
)

// Options configure a Cascade.
type Options struct {
	Deps     *picker.Deps
	Policies *Policies // nil: the built-in policies
	// Gateway is the gateway configuration; its prefill policy is the fallback when a
	// request names an unregistered one.
	Gateway config.PD
	// Preference, when set, is step 2b (adaptive bucket serving): consulted when bucket
	// serving is on for the request.
	Preference RolesetPreference
	// Fallbacks is how many fallbacks follow the primary on each side (default 2).
	Fallbacks int
	// Objectives resolves the InferenceObjective a request names (its priority marks it
	// sheddable for pd-predictive); nil: none are known.
	Objectives Objectives
	// Models, when set, are the online latency models of predicted_ttft and predicted_tpot,
	// the pd-predictive strategy and the placement deciders; they forget the endpoints that
	// leave the pool when Deps do. Nil: none of those.
	Models *latency.Models
	// TokenLoad, when set, are the ledgers of token_load and hybrid_cache_load (prefill) and
	// token_load (decode). Nil: those policies are not registered.
	TokenLoad *TokenLoad
	Logger    logr.Logger
}

// Cascade is the "pd" strategy: the seed's Pod Selection Algorithm as a plugin chain (see
// NewDefaultChain for its profiles, filters, scorers and deciders), and the PD state every
// PD plugin of the process shares: the policy registries, the prefill-in-flight and
// pending-decode trackers, the bucket-serve preference and the selection critical section.
// A --config-file composing PD from the same plugins shares them too.
type Cascade struct {
	deps      *picker.Deps
	policies  *Policies
	gwPrefill string
	prefer    RolesetPreference
	fallbacks int
	log       logr.Logger
	rand      func(n int) int
	// models are the online latency models the predictive policies and placement deciders
	// read (Options.Models); nil: none.
	models     *latency.Models
	objectives Objectives

	selectMu sync.Mutex
	prefill  *load.Tracker // prefill requests in flight per prefill endpoint
	pending  *load.Tracker // picked requests whose decode has not started, per decode endpoint
	noted    sync.Map      // policy fallback notes already logged

	chain *picker.Chain
	// afterScoring, when set (tests), runs between scoring and registration, inside the
	// critical section: it widens the window a missing lock would leave open.
	afterScoring func()
}

// New returns the cascade, running its default chain.
func New(o Options) *Cascade {
	if o.Deps == nil {
		o.Deps = picker.NewDeps(nil, o.Gateway.PrefixCache)
	}
	if o.Policies == nil {
		o.Policies = NewPolicies()
	}
	if o.Fallbacks <= 0 {
		o.Fallbacks = defaultFallbacks
	}
	deps := o.Deps
	intn := func(n int) int { // read late: a simulation may seed deps.Rand after New
		if deps.Rand != nil {
			return deps.Rand(n)
		}
		return rand.IntN(n)
	}
	c := &Cascade{
		deps: o.Deps, policies: o.Policies, gwPrefill: o.Gateway.PrefillScorePolicy, prefer: o.Preference,
		fallbacks: o.Fallbacks, log: o.Logger, rand: intn, objectives: o.Objectives,
		prefill: load.NewTracker(), pending: load.NewTracker(),
	}
	o.Deps.OnForget(func(live func(key string) bool) {
		picker.ForgetAbsent(c.prefill, live)
		picker.ForgetAbsent(c.pending, live)
	})
	if o.TokenLoad != nil {
		c.registerTokenLoad(o.TokenLoad)
	}
	if o.Models != nil {
		c.registerPredictive(o.Models)
	}
	c.chain = c.NewDefaultChain()
	return c
}

// Name implements picker.Strategy.
func (c *Cascade) Name() string { return StrategyName }

// Pick implements picker.Strategy: it runs the default chain.
func (c *Cascade) Pick(ctx context.Context, cy *picker.Cycle) (*picker.Decision, error) {
	return c.chain.Pick(ctx, cy)
}

// Chain is the cascade's plugin chain.
func (c *Cascade) Chain() *picker.Chain { return c.chain }

// Policies returns the policy registries (to register more policies).
func (c *Cascade) Policies() *Policies { return c.policies }

// Models are the latency models the predictive plugins read (Options.Models; nil: none).
func (c *Cascade) Models() *latency.Models { return c.models }

// Deps are the shared dependencies the cascade reads.
func (c *Cascade) Deps() *picker.Deps { return c.deps }

// PrefillInFlight is the number of prefill requests in flight on an endpoint.
func (c *Cascade) PrefillInFlight(key string) int64 { return c.prefill.InFlight(key) }

// Trackers are the cascade's own request counters, prefill requests in flight and pending
// decodes per endpoint (to share them across replicas).
func (c *Cascade) Trackers() (prefill, pending *load.Tracker) { return c.prefill, c.pending }

// PendingDecode is the number of picked requests whose decode has not started on an endpoint.
func (c *Cascade) PendingDecode(key string) int64 { return c.pending.InFlight(key) }

// CriticalSection is the lock every PD selection of the process holds from reading the
// trackers to registering its pick.
func (c *Cascade) CriticalSection() picker.Locker { return &c.selectMu }

func (c *Cascade) logger(ctx context.Context) logr.Logger {
	if l, err := logr.FromContext(ctx); err == nil {
		return l
	}
	return c.log
}
