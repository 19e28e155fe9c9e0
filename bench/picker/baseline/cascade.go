package baseline

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// StrategyName is the routing-strategy value of the cascade.
const StrategyName = "pd"

// HeaderPrefillerHostPort carries the prefill target to a decode-side sidecar (llm-d's
// routing sidecar reads it).
const HeaderPrefillerHostPort = "x-prefiller-host-port"

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
	Logger    logr.Logger
}

// Cascade is the "pd" strategy. Selection and the registration of its load (prefill in
// flight, pending decode) happen in one critical section, so concurrent picks see each
// other; prompt hashing and prefix matching happen before it.
type Cascade struct {
	deps      *picker.Deps
	policies  *Policies
	gwPrefill string
	prefer    RolesetPreference
	fallbacks int
	log       logr.Logger
	rand      func(n int) int

	selectMu sync.Mutex
	prefill  *load.Tracker // prefill requests in flight per prefill endpoint
	pending  *load.Tracker // picked requests whose decode has not started, per decode endpoint
	version  atomic.Uint64 // snapshot version the trackers were last pruned for
	noted    sync.Map      // policy fallback notes already logged

	nonInference *picker.Chain
	// afterScoring, when set (tests), runs between scoring and registration, inside the
	// critical section: it widens the window a missing lock would leave open.
	afterScoring func()
}

// New returns the cascade.
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
	return &Cascade{
		deps: o.Deps, policies: o.Policies, gwPrefill: o.Gateway.PrefillScorePolicy, prefer: o.Preference,
		fallbacks: o.Fallbacks, log: o.Logger, rand: intn,
		prefill: load.NewTracker(), pending: load.NewTracker(),
		nonInference: picker.NewLeastRequestStrategy(o.Deps),
	}
}

// Name implements picker.Strategy.
func (c *Cascade) Name() string { return StrategyName }

// Policies returns the policy registries (to register more policies).
func (c *Cascade) Policies() *Policies { return c.policies }

// PrefillInFlight is the number of prefill requests in flight on an endpoint.
func (c *Cascade) PrefillInFlight(key string) int64 { return c.prefill.InFlight(key) }

// PendingDecode is the number of picked requests whose decode has not started on an endpoint.
func (c *Cascade) PendingDecode(key string) int64 { return c.pending.InFlight(key) }

// selection is the working state of one pick.
type selection struct {
	knobs     *config.PD
	prefPol   PrefillPolicy
	decPol    DecodePolicy
	pt        partition
	trace     *picker.Trace
	match     map[string]float64 // endpoint key -> prefix match %
	hashes    []uint64
	fastSteps []string
}

// Pick implements picker.Strategy.
func (c *Cascade) Pick(ctx context.Context, cy *picker.Cycle) (*picker.Decision, error) {
	c.pruneFor(cy.Snap)
	if cy.Req.API == request.APIOther {
		d, err := c.nonInference.Pick(ctx, cy)
		if d != nil {
			d.Step = StepNonInference
		}
		return d, err
	}
	s := &selection{knobs: &cy.Resolved.PD, trace: &picker.Trace{Candidates: len(cy.Candidates)}}
	var note string
	var err error
	s.prefPol, s.decPol, note, err = c.policies.resolve(c.gwPrefill, s.knobs, &cy.Resolved.Routing)
	if note != "" {
		if _, seen := c.noted.LoadOrStore(note, struct{}{}); !seen {
			c.logger(ctx).Info("score policy not registered, falling back (logged once)", "request", cy.Req.ID, "detail", note)
		}
	}
	if err != nil {
		return nil, apierror.Unavailable("unknown_decode_policy",
			"%v; fix decodeScorePolicy in the model config or AIBRIX_DECODE_SCORE_POLICY", err)
	}
	s.trace.Note = fmt.Sprintf("%sprefill_policy=%s decode_policy=%s prompt_tokens=%d", note, s.prefPol.Name(), s.decPol.Name(), cy.Req.PromptTokens)

	// Outside the critical section: partition, bucketing, prompt hashing, prefix match.
	// The chain's bucket length (cl100k_base tokens near a boundary): the decisions compared
	// side by side must bucket alike.
	s.pt = partitionCandidates(cy.Candidates, cy.PodRouting, s.knobs.PromptLengthBucketing, pd.BucketLength(cy))
	if s.pt.bucketed {
		s.trace.Add("bucketing")
	}
	if len(s.pt.rolesets) == 0 {
		return c.noPair(cy, s)
	}
	if s.prefPol.UsesPrefix() {
		c.matchPrefix(cy, s)
	}

	c.selectMu.Lock()
	d, err := c.selectLocked(cy, s)
	c.selectMu.Unlock()
	if err != nil {
		return nil, err
	}
	if len(d.Prefill) > 0 && s.prefPol.UsesPrefix() {
		c.deps.WarmPrefix(cy.Req.Model, s.hashes, d.Prefill[0].Key())
	}
	return d, nil
}

func (c *Cascade) logger(ctx context.Context) logr.Logger {
	if l, err := logr.FromContext(ctx); err == nil {
		return l
	}
	return c.log
}

// pruneFor forgets tracker entries of endpoints that left the pool, once per snapshot.
func (c *Cascade) pruneFor(snap *pool.Snapshot) {
	if snap == nil {
		return
	}
	old := c.version.Load()
	// Only a newer snapshot prunes: a request still holding an older one must not forget
	// the counters of endpoints that joined since.
	if snap.Version <= old || !c.version.CompareAndSwap(old, snap.Version) {
		return
	}
	forgetGone(snap, []*load.Tracker{c.prefill, c.pending}, nil)
}

func (c *Cascade) matchPrefix(cy *picker.Cycle, s *selection) {
	if c.deps.Prefix == nil {
		return
	}
	s.hashes = picker.PromptHashes(cy, s.knobs.PrefixCache.BlockSize)
	if len(s.hashes) == 0 {
		return
	}
	c.deps.Prefix.Match(cy.Req.Model, s.hashes, func(key string, pct float64) {
		if s.match == nil {
			s.match = make(map[string]float64)
		}
		s.match[key] = pct
	})
}

// noPair handles "no complete roleset": a combined pod chosen at random, else a 503.
// Without bucketing the seed has no combined fallback; Tandem still uses a configured
// combined pod rather than failing (the seed's overview promises that fallback).
func (c *Cascade) noPair(cy *picker.Cycle, s *selection) (*picker.Decision, error) {
	if len(s.pt.combined) > 0 {
		step := StepCombinedNoRoleset
		if s.pt.bucketed {
			step = StepCombinedNoBucket
		}
		order := make([]*pool.Endpoint, len(s.pt.combined))
		copy(order, s.pt.combined)
		for i := len(order) - 1; i > 0; i-- {
			j := c.rand(i + 1)
			order[i], order[j] = order[j], order[i]
		}
		return c.combinedDecision(s, step, order), nil
	}
	if s.pt.bucketed && (s.pt.nPrefill > 0 && s.pt.nDecode > 0) {
		return nil, apierror.Unavailable("no_bucket_match",
			"no prompt-length bucket matches prompt length %d tokens and no combined pod covers it; "+
				"widen promptLenBucketMinLength/promptLenBucketMaxLength or add a combined: true pod", cy.Req.PromptTokens)
	}
	return nil, apierror.Unavailable("no_pd_pair",
		"no complete prefill/decode roleset among %d candidates (prefill pods %d, decode pods %d, incomplete rolesets %d) "+
			"and no combined pod; pair prefill and decode pods with the same roleset-name, or use another routing-strategy",
		len(cy.Candidates), s.pt.nPrefill, s.pt.nDecode, s.pt.incomplete)
}

func (c *Cascade) combinedDecision(s *selection, step string, ranked []*pool.Endpoint) *picker.Decision {
	ranked = ranked[:min(len(ranked), c.fallbacks+1)]
	s.trace.Add(step)
	d := &picker.Decision{Outcome: picker.OutcomeCombined, Step: step, Destination: ranked, Trace: s.trace}
	d.Lifecycle = newCombinedLifecycle(c, ranked)
	return d
}

// combinedScore is the seed's queue-drain ratio of a pod:
// (waiting + prefill prealloc queue + decode prealloc queue) / drain rate.
// Missing metrics count as 0. The drain rate is floored at 0.01 requests/s (the floor
// the seed's own Prometheus query applies), so an idle pod that completed nothing scores
// 0 (idle) instead of 0/0, and a pod with a backlog but no completions scores 100× its
// backlog (saturated) instead of +Inf.
func (c *Cascade) combinedScore(e *pool.Endpoint) float64 {
	var backlog float64
	if smp := c.deps.Metrics.Get(e.Key()); smp != nil {
		if smp.HasWaiting {
			backlog += smp.Waiting
		}
		if smp.HasPreallocQueues {
			backlog += smp.PrefillPreallocQueue + smp.DecodePreallocQueue
		}
	}
	drain := 0.0
	if c.deps.Drain != nil {
		drain = c.deps.Drain.PerSecond(e.Key())
	}
	return backlog / math.Max(drain, combinedDrainFloor)
}

// shouldPickCombined: some combined pod is idle and some PD pod (prefill checked first)
// is saturated, by the same queue-drain score.
func (c *Cascade) shouldPickCombined(s *selection) bool {
	idle := false
	for _, e := range s.pt.combined {
		if c.combinedScore(e) < combinedLowLoadScore {
			idle = true
			break
		}
	}
	if !idle {
		return false
	}
	for _, rs := range s.pt.rolesets {
		for _, e := range rs.prefill {
			if c.combinedScore(e) > pdHighLoadScore {
				return true
			}
		}
	}
	for _, rs := range s.pt.rolesets {
		for _, e := range rs.decode {
			if c.combinedScore(e) > pdHighLoadScore {
				return true
			}
		}
	}
	return false
}

// rankCombined orders combined pods by combinedScore, lowest first, ties at random, and
// records the scores in the trace.
func (c *Cascade) rankCombined(s *selection, eps []*pool.Endpoint) []*pool.Endpoint {
	type sc struct {
		e   *pool.Endpoint
		s   float64
		tie int
	}
	xs := make([]sc, len(eps))
	for i, e := range eps {
		xs[i] = sc{e, c.combinedScore(e), c.rand(1 << 30)}
	}
	sortBy(xs, func(a, b sc) bool { return a.s < b.s || (a.s == b.s && a.tie < b.tie) })
	out := make([]*pool.Endpoint, len(xs))
	s.trace.Scores = make(map[string]string, min(len(xs), maxTracedRolesets))
	for i := range xs {
		out[i] = xs[i].e
		if i < maxTracedRolesets {
			s.trace.Scores["combined "+xs[i].e.Key()] = fmt.Sprintf("%.4f", xs[i].s)
		}
	}
	return out
}
