package picker

import (
	"context"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// Scheduler picks the endpoints that serve one request. candidates is the part of the
// snapshot the request may reach (after the subset hint and any test selection); it is
// never empty. Errors should be *apierror.Error so the client gets the right status.
type Scheduler interface {
	Schedule(ctx context.Context, req *request.Request, snap *pool.Snapshot, candidates []*pool.Endpoint) (*Decision, error)
}

// retryKey marks a Schedule call's context as a retry's pick.
type retryKey struct{}

// WithRetry marks ctx as that of a retry's pick (a request whose first attempt failed and
// may be tried again elsewhere): its failure is not the request's, which ends with the first
// attempt's error, so it must not be counted as one.
func WithRetry(ctx context.Context) context.Context { return context.WithValue(ctx, retryKey{}, true) }

// IsRetry reports whether ctx is a retry's pick (WithRetry).
func IsRetry(ctx context.Context) bool { return ctx.Value(retryKey{}) != nil }

// Outcome says which kind of target a decision chose.
type Outcome string

const (
	OutcomePD       Outcome = "pd"       // a prefill/decode pair from one roleset
	OutcomeCombined Outcome = "combined" // a standard pod running both phases
	OutcomeSingle   Outcome = "single"   // a non-PD strategy's pick
	OutcomeLocal    Outcome = "local"    // a decode pod of a roleset running the whole request (selective disaggregation)
)

// Decision is the answer for one request.
type Decision struct {
	Strategy string
	Outcome  Outcome
	// Step names what decided, from a bounded set (e.g. "least_request", "prefill_imbalance").
	Step string
	// Destination is the decode (or combined, or single) endpoint first, then ranked fallbacks.
	Destination []*pool.Endpoint
	// Prefill is the prefill endpoint first, then fallbacks from the same roleset; empty unless Outcome is pd.
	Prefill []*pool.Endpoint
	// SetHeaders are request headers to set on the upstream request.
	SetHeaders map[string]string
	// ResponseHeaders are added to the response the client sees.
	ResponseHeaders map[string]string
	// Body, when non-nil, replaces the request body sent upstream.
	Body []byte
	// Trace explains the decision.
	Trace *Trace
	// Lifecycle, when non-nil, receives the response events of this request.
	Lifecycle Lifecycle
	// Handoff is how a PD decision's prefill leg runs (config.HandoffAuto, HandoffSidecar or
	// HandoffEPP), resolved for the request's profile; "" means sidecar. The ext_proc server
	// resolves auto per request (from the decode pod). The Router
	// fills it (and PD) when the strategy left it empty.
	Handoff string
	// PD is the request's effective PD configuration (gateway settings with the profile's
	// overrides): the hand-off's timeouts, abort and watchdog settings.
	PD config.PD
	// Route is the one record of what happens to the routed request (internal/outcome), which
	// every reader reads (latency models, advisor, passive health, transfer proof). A strategy
	// whose Lifecycle writes a record sets it (in Deps.Outcomes); the ext_proc server starts one
	// in the same recorder when the strategy did not, and reports into it first what only it
	// knows (the classified endings, the endpoint that served). Nil records nothing.
	Route *outcome.Tracker
}

// Lifecycle receives what happens to a routed request after the pick. The ext_proc server
// calls ResponseHeaders at most once, ResponseBody per chunk, and Done exactly once on every
// path (completion, upstream error, client cancel, stream reset). served is the endpoint of
// the decision's Destination the gateway reports as having answered, looked up once by the
// caller (nil: not reported, or none of them).
type Lifecycle interface {
	ResponseHeaders(status int, served *pool.Endpoint)
	ResponseBody(size int, endOfStream bool)
	Done(err error)
}

// Trace records how a decision was reached, for debug logs, metrics and the opt-in header.
type Trace struct {
	Steps      []string          `json:"steps"`
	Candidates int               `json:"candidates"`
	Scores     map[string]string `json:"scores,omitempty"` // endpoint or roleset -> formatted score
	// ScoreDirection says which Scores win: LowerIsBetter (costs, predicted milliseconds) or
	// HigherIsBetter (the weighted [0, 1] totals of a scorer chain); "" when there are none.
	ScoreDirection string `json:"score_direction,omitempty"`
	Note           string `json:"note,omitempty"`
	// Health lists candidates passive health left out of the pick: endpoint key ->
	// "ejected:<reason>" or "recent_failure" (at most 8).
	Health map[string]string `json:"health,omitempty"`
	// Unpaired lists PD candidates the pair-match labels left without a pair (their
	// revision has no pod of the other role): endpoint key -> its roleset identity (at most 8).
	Unpaired map[string]string `json:"unpaired,omitempty"`
}

// Trace.ScoreDirection values.
const (
	LowerIsBetter  = "lower is better"
	HigherIsBetter = "higher is better"
)

// Add appends a step to the trace.
func (t *Trace) Add(step string) {
	if t != nil {
		t.Steps = append(t.Steps, step)
	}
}
