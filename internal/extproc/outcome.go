package extproc

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// Every routed request has one outcome record, the decision's Route (Options.Outcomes, the
// strategies' recorder). The decision's lifecycle writes its events; the ext_proc server
// reports into it first what only it knows — how the prefill leg and the request ended,
// translated into outcome.Failure so readers can tell an endpoint's fault from a client's, and
// the endpoint the gateway says served — and writes every event itself when the strategy
// started no record.

// errUnobserved ends the route of a destination-only client, which never sends the response:
// nothing is known of the endpoint.
var errUnobserved = errors.New("the gateway client does not report responses")

// startRoute adopts the decision's outcome record, or starts one (the kind, the endpoints)
// when the strategy did not, and notes the fallbacks the gateway receives. The server writes
// the response chunks only into a record it started: the strategy's lifecycle writes them into
// its own.
func (st *stream) startRoute(req *request.Request, d *picker.Decision, mode string) {
	st.ownRoute = d.Route == nil
	if st.ownRoute {
		kind, prefill := outcome.KindWhole, ""
		if mode != "" {
			kind, prefill = outcome.KindPD, d.Prefill[0].Key()
		}
		d.Route = st.srv.opts.Outcomes.Start(kind, prefill, d.Destination[0].Key(), req.PromptTokens)
	}
	st.promptTokens = req.PromptTokens
	if st.fallbacks && len(d.Destination) > 1 {
		keys := make([]string, len(d.Destination)-1)
		for i, e := range d.Destination[1:] {
			keys[i] = e.Key()
		}
		d.Route.Fallbacks(keys...)
	}
	st.route = d.Route
}

// routeResponse reports the response headers, before the lifecycle does: the status and the
// endpoint that served (the gateway names it by host:port: ep when it is one of the decision's
// destinations, else looked up in the pool). Without the EPP hand-off, which reports the
// prefill leg itself, the answer also tells how the leg ended (outcome.Tracker.Answered).
func (st *stream) routeResponse(code int, served string, ep *pool.Endpoint) {
	if st.route == nil {
		return
	}
	key := ""
	if ep != nil {
		key = ep.Key()
	} else if e, ok := st.srv.store.Load().ByHostPort(served); ok && served != "" {
		key = e.Key()
	}
	if st.ho.active() {
		st.route.Response(code, key)
		return
	}
	st.route.Answered(code, key, ep != nil && ep.Role != pool.RoleDecode)
}

// endRoute ends the outcome record with what the stream knows of how the request ended, before
// the lifecycle does (the first report wins).
func (st *stream) endRoute(err error) {
	if st.route == nil {
		return
	}
	st.route.End(st.outcomeErr(err))
	st.route = nil
}

// outcomeErr translates how the stream ended for the outcome readers.
func (st *stream) outcomeErr(err error) error {
	if err == nil {
		return nil
	}
	var ae *apierror.Error
	switch {
	case st.destOnly && !st.respHeaders:
		return errUnobserved
	case errors.Is(err, ErrStreamEnded) && !st.respHeaders:
		// The gateway ended the stream after Tandem routed it and before any response: the
		// client left. A gateway that could not reach the endpoint, or gave up waiting for
		// it, answers with a local reply whose status the response phase carries
		// (ending.go), so this says nothing of the endpoint.
		return &outcome.Failure{Origin: outcome.OriginCaller, Err: err}
	case !st.respHeaders && (status.Code(err) == codes.Canceled || status.Code(err) == codes.DeadlineExceeded):
		return &outcome.Failure{Origin: outcome.OriginCaller, Err: err}
	case errors.As(err, &ae) && ae.Reason == ReasonDecodeWatchdog:
		return &outcome.Failure{Origin: outcome.OriginGateway, Err: err} // the decode pod stalled
	}
	return err
}

// legOutcome translates a prefill leg's result for the outcome readers.
func legOutcome(err error) error {
	var f *handoff.Failure
	if err == nil || !errors.As(err, &f) {
		return err
	}
	switch f.Class {
	case handoff.ClassHTTPStatus:
		return &outcome.Failure{Origin: outcome.OriginUpstream, Status: f.EngineStatus, Err: err}
	case handoff.ClassBadResponse:
		return &outcome.Failure{Origin: outcome.OriginUpstream, Status: 500, Err: err}
	case handoff.ClassTransport, handoff.ClassTimeout:
		return &outcome.Failure{Origin: outcome.OriginGateway, Err: err}
	case handoff.ClassCanceled:
		// The client left, or outlier detection ejected the pod mid-flight (judged already).
		return &outcome.Failure{Origin: outcome.OriginCaller, Err: err}
	}
	return err
}
