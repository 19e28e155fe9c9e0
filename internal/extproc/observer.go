package extproc

import (
	"time"

	"github.com/tandem-epp/tandem/internal/picker"
)

// Observer receives what the ext_proc server sees, for metrics. Calls happen on the stream's
// goroutine, so implementations must be safe for concurrent use and must not block.
type Observer interface {
	// StreamOpened and StreamClosed bracket every ext_proc stream (one HTTP request each).
	StreamOpened()
	StreamClosed()
	// RequestBody reports the size of a complete request body, once per request that has one.
	RequestBody(bytes int)
	// Decided reports a successful pick.
	Decided(DecisionEvent)
	// RequestFailed reports a request answered with an ImmediateResponse: the HTTP status and
	// the error's bounded reason label (e.g. "no_endpoint", "body_too_large", the admission
	// refusals "too_many_streams", "body_budget_exhausted", "body_timeout").
	RequestFailed(status int, reason string)
	// Panicked reports a recovered panic; where is a bounded label ("extproc_stream", ...).
	Panicked(where string)
	// FieldsRemoved reports the client-sent PD control fields removed from one request's body
	// (names from request.ControlFields).
	FieldsRemoved(fields []string)
}

// DecisionEvent describes one pick.
type DecisionEvent struct {
	Strategy string
	Outcome  picker.Outcome
	Step     string
	// Latency is the time from the end of the request (last body chunk, or headers without
	// a body) to the answer being ready: parsing, candidate selection and scheduling.
	Latency time.Duration
	// Candidates is how many endpoints the scheduler could choose from.
	Candidates int
}

// nopObserver is used when Options.Observer is nil.
type nopObserver struct{}

func (nopObserver) StreamOpened()             {}
func (nopObserver) StreamClosed()             {}
func (nopObserver) RequestBody(int)           {}
func (nopObserver) Decided(DecisionEvent)     {}
func (nopObserver) RequestFailed(int, string) {}
func (nopObserver) Panicked(string)           {}
func (nopObserver) FieldsRemoved([]string)    {}
