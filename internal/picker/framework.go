package picker

import (
	"context"
	"math/rand/v2"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// The extension points of a scheduling cycle, one small interface each. A strategy built
// from them (a Chain) runs: every DataProducer, outside any critical section; then, inside
// the handler's critical section when it has one, the ProfileHandler's rounds (each profile
// narrows its endpoints with its Filters, scores the survivors with its weighted Scorers
// and lets its Picker rank them), the handler's Result and every Reserver; then, outside
// it, the PostPick hooks. ResponseComplete hooks see the end of the request. Plugins are
// built by type name from a Registry and reach each other through a Handle.

// Plugin is anything a Registry builds. Type is the registry name, Name the instance name
// (a config file may declare two instances of one type with different parameters).
type Plugin interface {
	Type() string
	Name() string
}

// ProfileHandler chooses which profiles run for a request, on which endpoints, and turns
// their results into the Decision.
type ProfileHandler interface {
	Plugin
	// Next returns the profiles to run now, given the results of those already run
	// (keyed by profile name); none ends the rounds.
	Next(ctx context.Context, c *Cycle, profiles []*Profile, done map[string]*ProfileResult) []ProfileRun
	// Result builds the decision from the rounds' results: at least Destination (the
	// destination first, then fallbacks) and, for PD, Prefill. The chain fills what it
	// leaves empty (Outcome, Step, Trace, Lifecycle).
	Result(ctx context.Context, c *Cycle, done map[string]*ProfileResult) (*Decision, error)
}

// ProfileRun is one profile to run and the endpoints it starts from (nil: the cycle's
// candidates).
type ProfileRun struct {
	Profile   *Profile
	Endpoints []*pool.Endpoint
}

// Filter removes the endpoints that must not serve the request. It keeps their order, and
// returns a new slice (or eps itself) rather than writing into eps: the slices a filter is
// given may be shared by every pick of a snapshot (the snapshot's own endpoints, the roleset
// handler's sorting of them).
type Filter interface {
	Plugin
	Filter(ctx context.Context, c *Cycle, eps []*pool.Endpoint) []*pool.Endpoint
}

// Scorer rates each endpoint in [0, 1], higher is better; out has len(eps) and starts zeroed.
// Scores outside [0, 1] are clamped before they are weighted.
type Scorer interface {
	Plugin
	Score(ctx context.Context, c *Cycle, eps []*pool.Endpoint, out []float64)
}

// Picker ranks scored endpoints: the primary first, then fallbacks.
type Picker interface {
	Plugin
	Pick(ctx context.Context, c *Cycle, scored []ScoredEndpoint) []*pool.Endpoint
}

// DataProducer prepares per-request data before the cycle's critical section (prompt
// hashing, prefix matching, partitions) and writes it to the cycle's State. An error ends
// the cycle; it should be an *apierror.Error.
type DataProducer interface {
	Plugin
	Produce(ctx context.Context, c *Cycle) error
}

// Reserver runs inside the critical section right after the decision is made, so that what
// it registers (a ledger charge) is seen by the next pick.
type Reserver interface {
	Plugin
	Reserve(ctx context.Context, c *Cycle, d *Decision)
}

// PostPick runs after a decision is made, outside the critical section (prefix warming,
// accounting that must not delay the pick).
type PostPick interface {
	Plugin
	PostPick(ctx context.Context, c *Cycle, d *Decision)
}

// ResponseComplete runs once when the routed request ends (Lifecycle.Done).
type ResponseComplete interface {
	Plugin
	ResponseComplete(c *Cycle, d *Decision, err error)
}

// Exclusive is implemented by a profile handler whose selection must not interleave with
// another pick's: the chain holds the returned lock from the first round to the last
// Reserver (the seed's "select and charge together"). Handlers sharing counters share a lock.
type Exclusive interface {
	CriticalSection() Locker
}

// Locker is sync.Locker, named here so handlers need not import sync to return one.
type Locker interface {
	Lock()
	Unlock()
}

// ProfileBinder is implemented by a profile handler that needs named profiles: a chain
// calls Bind once with all its profiles, and a missing or misfit profile is a config error.
type ProfileBinder interface {
	Bind(profiles []*Profile) error
}

// ScoredEndpoint is an endpoint with its weighted total score.
type ScoredEndpoint struct {
	Endpoint *pool.Endpoint
	Score    float64
}

// Cycle is one request's scheduling cycle: what every plugin may read, plus State for
// what plugins pass each other. Plugins keep configuration; everything about the request
// lives here.
type Cycle struct {
	Req        *request.Request
	Snap       *pool.Snapshot
	Candidates []*pool.Endpoint
	Resolved   Resolved
	// PodRouting returns an endpoint's routingConfig for this request's profile.
	PodRouting func(*pool.Endpoint) config.RoutingConfig
	State      *CycleState

	// intn is the random source of this cycle's picks (Deps.Rand, set by Chain.Pick);
	// nil means math/rand/v2's global source.
	intn func(n int) int
}

// RandN returns a random int in [0, n) from the cycle's source (Deps.Rand when set, so a
// seeded simulation is reproducible).
func (c *Cycle) RandN(n int) int {
	if c != nil && c.intn != nil {
		return c.intn(n)
	}
	return rand.IntN(n)
}

// Routing returns e's routingConfig for the request's profile (zero without PodRouting).
func (c *Cycle) Routing(e *pool.Endpoint) config.RoutingConfig {
	if c.PodRouting == nil {
		return config.RoutingConfig{}
	}
	return c.PodRouting(e)
}
