package outcome

import (
	"errors"
	"time"
)

// Origin says where a failed leg failed, so a reader can judge the endpoint without knowing
// the writer's error types.
type Origin uint8

const (
	// OriginUpstream: the endpoint answered, with an error status (Failure.Status).
	OriginUpstream Origin = iota + 1
	// OriginGateway: the endpoint gave no usable answer: the connection was refused or reset,
	// or it timed out. Envoy calls these locally originated errors.
	OriginGateway
	// OriginCaller: the client (or the gateway or Tandem on its behalf) ended the request;
	// the endpoint is not to blame (docs/stream-endings.md).
	OriginCaller
)

func (o Origin) String() string {
	switch o {
	case OriginUpstream:
		return "upstream"
	case OriginGateway:
		return "gateway"
	case OriginCaller:
		return "caller"
	}
	return "unknown"
}

// Failure is an error a writer reports (to Tracker.End or Tracker.PrefillEnd) when it knows
// how the leg failed. Errors that are not a Failure say nothing about the endpoint.
type Failure struct {
	Origin Origin
	// Status is the endpoint's HTTP status for OriginUpstream (0 otherwise).
	Status int
	Err    error
}

func (f *Failure) Error() string {
	if f.Err == nil {
		return "outcome: " + f.Origin.String() + " failure"
	}
	return f.Err.Error()
}

func (f *Failure) Unwrap() error { return f.Err }

// FailureOf returns the Failure in err's chain, nil when there is none.
func FailureOf(err error) *Failure {
	var f *Failure
	if errors.As(err, &f) {
		return f
	}
	return nil
}

// ErrNoResponse is the cause a writer gives an OriginGateway failure when it learns, without
// a response status, that the gateway could not reach the endpoint. (A stream that merely ends
// with no response headers says no such thing: gateways report an unreachable endpoint with a
// local reply's status, and such an ending is the caller's.)
var ErrNoResponse = errors.New("the request ended after routing with no response from the destination")

// ErrPrefillNotRun is the PrefillErr of a PD route whose prefill leg never ran: the request was
// served whole, by its decode pod (for a client that cannot carry the hand-off) or by a
// combined fallback. Not a Failure: it says nothing of the prefill endpoint.
var ErrPrefillNotRun = errors.New("no prefill leg ran: the request was served whole")

// Fallbacks records the endpoints the gateway may try after the destination, in order. Call
// it right after Start, before any other event of the route.
func (t *Tracker) Fallbacks(keys ...string) {
	if t == nil || len(keys) == 0 {
		return
	}
	t.mu.Lock()
	if !t.ended {
		t.r.Fallbacks = append([]string(nil), keys...)
	}
	t.mu.Unlock()
}

// Probe is the result of one scrape or health probe of an endpoint: passive health's other
// input besides routed requests.
type Probe struct {
	// Endpoint is the endpoint's key ("namespace/pod:port").
	Endpoint string
	// Source names the prober ("scrape", "health_probe").
	Source string
	// Err is nil for a probe that succeeded.
	Err error
	// Refused: the connection was refused; Timeout: the probe timed out.
	Refused, Timeout bool
	// ServingPort says the probe went to the endpoint's serving port (a refused connection
	// there means nothing listens where requests are sent).
	ServingPort bool
	Took        time.Duration
	// At is the recorder's clock when the probe was recorded.
	At time.Time
}

// Probe hands a probe result to every reader (PhaseProbe). A nil recorder records nothing.
func (r *Recorder) Probe(p Probe) {
	if r == nil {
		return
	}
	p.At = r.clock.Now()
	rs := r.readers.Load()
	if rs == nil {
		return
	}
	e := Event{Phase: PhaseProbe, Probe: &p}
	for _, rd := range *rs {
		rd.Observe(&e)
	}
}
