package extproc

import (
	"context"
	"errors"
	"net/http"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// HandoffObserver is implemented by an Observer that also counts the "epp" hand-off's decode
// watchdog (gateway_pd_decode_watchdog_total). Prefill outcomes and aborts are reported by the
// handoff package's own Observer; failed requests by Lifecycle.Done with an *apierror.Error.
type HandoffObserver interface {
	// DecodeWatchdog reports one firing: phase is "first_response" or "stream_idle".
	DecodeWatchdog(model, phase string)
}

// ReasonDecodeWatchdog is the apierror reason of a request the decode watchdog ended (the
// seed's gateway_request_model_fail_total status label).
const ReasonDecodeWatchdog = "pd_decode_watchdog"

// eppHandoff is a stream's "epp" hand-off: Tandem ran (or is running) the prefill leg and
// watches the decode leg. Its zero value (no hand-off) has nil channels, which never fire in
// the stream loop's select.
type eppHandoff struct {
	h         *handoff.Handoff
	wd        *handoff.Watchdog
	model     string
	failed    <-chan *apierror.Error
	succeeded <-chan struct{}
	timer     *time.Timer
	timerOn   bool
	// held is the response headers answer, held back until the first response body chunk:
	// until it goes out the client has no status, so a watchdog firing or a prefill failure
	// can still be answered with a clean error instead of a cut stream.
	held      *extprocv3.ProcessingResponse
	holdUntil time.Time // the held answer goes out by then at the latest
	sent      bool      // the response headers answer went out
	status    int       // the decode leg's response status, once its headers came
}

func (e *eppHandoff) active() bool { return e.h != nil }

func (e *eppHandoff) timerC() <-chan time.Time {
	if !e.timerOn {
		return nil
	}
	return e.timer.C
}

// rearm sets the timer to the watchdog's next deadline or the end of the response headers
// hold, whichever comes first (or stops it).
func (e *eppHandoff) rearm() {
	at, ok := e.wd.Deadline()
	if e.held != nil && (!ok || e.holdUntil.Before(at)) {
		at, ok = e.holdUntil, true
	}
	if !ok {
		if e.timerOn {
			e.timer.Stop()
			e.timerOn = false
		}
		return
	}
	d := time.Until(at)
	if e.timer == nil {
		e.timer = time.NewTimer(d)
	} else {
		e.timer.Reset(d)
	}
	e.timerOn = true
}

func (e *eppHandoff) stop() {
	if e.wd != nil {
		e.wd.Finish()
	}
	if e.timer != nil {
		e.timer.Stop()
	}
	e.timerOn = false
}

// handoffMode says how a decision's prefill leg runs: "" for decisions without one. The auto
// mode (the default) resolves per request: the sidecar hand-off when the decode pod declares a
// routing sidecar (pool.Endpoint.RoutingSidecar), else the epp hand-off, so plain engine pods
// disaggregate.
// The epp hand-off needs a body (it rewrites it) and a server with adapters; without them the
// auto mode names the prefill pod for a sidecar instead.
func (s *Server) handoffMode(d *picker.Decision, hasBody bool) string {
	if d.Outcome != picker.OutcomePD || len(d.Prefill) == 0 {
		return ""
	}
	switch d.Handoff {
	case config.HandoffEPP:
		if hasBody {
			return config.HandoffEPP
		}
	case config.HandoffAuto:
		// Pods behind a proxy other than llm-d's routing sidecar say so with
		// routingConfig.handoff: sidecar (or TANDEM_PD_HANDOFF=sidecar).
		if hasBody && s.opts.Handoff != nil && !d.Destination[0].RoutingSidecar() {
			return config.HandoffEPP
		}
	}
	return config.HandoffSidecar
}

// startHandoff runs the "epp" hand-off of a PD decision up to the decode body: it checks that
// the pair's two pods agree on one engine (the model's standard pods may run another),
// prepares both legs and starts the prefill leg on the stream's context (the client going
// away cancels it). Sync engines return after the prefill leg; async ones at once, reporting
// a failure later on st.ho.failed.
func (st *stream) startHandoff(req *request.Request, d *picker.Decision) ([]byte, *apierror.Error) {
	adapters := st.srv.opts.Handoff
	if adapters == nil {
		return nil, apierror.Unavailable("pd_handoff_unavailable",
			"the request's profile asks for the epp prefill/decode hand-off but this server runs without one; set TANDEM_PD_HANDOFF=sidecar or routingConfig.handoff: sidecar, or start Tandem with the hand-off enabled")
	}
	prefill, decode := d.Prefill[0], d.Destination[0]
	if _, err := handoff.EngineOf([]*pool.Endpoint{prefill, decode}); err != nil {
		return nil, apierror.From(err)
	}
	in := handoff.Input{
		Leg: handoff.Leg{RequestID: st.headers[wire.HeaderRequestID], Path: st.path, API: req.API, Body: st.body,
			Prefill: prefill, Decode: decode},
		Headers: st.headers, PD: d.PD,
	}
	po, _ := d.Lifecycle.(pd.PrefillObserver)
	route := st.route
	route.ReportsLeg()
	in.PrefillDone = func(err error) {
		route.PrefillEnd(legOutcome(err), true) // classified, before the lifecycle's report
		if po != nil {
			po.PrefillDone(err)
		}
	}
	h, err := adapters.New(st.ctx, in)
	if err != nil {
		return nil, apierror.From(err)
	}
	st.ho = eppHandoff{h: h, model: req.Model, wd: handoff.NewWatchdog(d.PD, decode.PodKey(), decode.Engine, req.Stream)}
	d.Trace.Add("handoff_epp:" + h.Engine())
	ctx, ejected, stop := st.watchEjection(h, prefill)
	began := time.Now()
	body, aerr := h.Start(ctx)
	st.prefillLeg = time.Since(began) // a sync leg's whole duration (an async one returns at once)
	stop()
	if aerr != nil {
		if ejected() {
			aerr = &apierror.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Header: apierror.HeaderPDPrefill,
				Reason: handoff.ReasonPrefillFailure, Class: ClassPrefillEjected, Message: "prefill request failed: outlier detection ejected the prefill pod " + prefill.Key() + " while its leg was in flight"}
		}
		return nil, aerr
	}
	st.ho.failed, st.ho.succeeded = h.Failed(), h.PrefillSucceeded()
	return body, nil
}

// watchEjection gives a sync prefill leg a context that outlier detection cancels when it
// ejects the prefill pod mid-flight, so the pair-level retry need not wait for the leg's
// timeout. An async leg outlives the call and keeps the stream's context.
func (st *stream) watchEjection(h *handoff.Handoff, prefill *pool.Endpoint) (ctx context.Context, ejected func() bool, stop func()) {
	if h.Async() || st.srv.opts.Health == nil {
		return st.ctx, func() bool { return false }, func() {}
	}
	ctx, cancel := context.WithCancelCause(st.ctx)
	unwatch := st.srv.opts.Health.OnEject(prefill.Key(), func() { cancel(errPrefillEjected) })
	return ctx, func() bool { return errors.Is(context.Cause(ctx), errPrefillEjected) }, func() {
		unwatch()
		cancel(nil)
	}
}

var errPrefillEjected = errors.New("the prefill pod was ejected by outlier detection")

// eppFallbacks keeps, of a PD decision's destinations, the decode pod and the fallbacks that
// can take the decode body the epp hand-off forwards: decode pods of its roleset identity (name
// and revision) and engine (the
// body carries one prefill leg's kv_transfer_params, bootstrap_* or generation-only
// disaggregated_params, which only they can use). Combined fallbacks stay for the sidecar
// hand-off, whose body is the client's.
func eppFallbacks(dest []*pool.Endpoint) []*pool.Endpoint {
	if len(dest) < 2 {
		return dest
	}
	primary := dest[0]
	out := make([]*pool.Endpoint, 1, len(dest))
	out[0] = primary
	for _, e := range dest[1:] {
		if e.Role == pool.RoleDecode && e.RolesetKey() == primary.RolesetKey() && e.Engine == primary.Engine {
			out = append(out, e)
		}
	}
	return out
}

// failRouted answers a request that was routed (the decision holds resources) but cannot be
// served, before the client saw a response status: an ImmediateResponse, and the decision's
// Lifecycle ends with the error (telemetry counts it by its reason and status).
func (st *stream) failRouted(e *apierror.Error) (bool, error) {
	st.log.V(1).Info("request failed", "status", e.Status, "reason", e.Reason, "message", e.Message, "path", st.path)
	st.rejected, st.answered = true, true
	st.ho.stop()
	st.finish(e)
	if err := st.send(errorAnswer(e)); err != nil {
		return true, err
	}
	return st.reqEnded, nil
}

// handoffServed tells the hand-off which decode pod the gateway sent the leg to, when it
// reports one among the decision's destinations (e; nil when not): aborts and the watchdog's
// answer name that pod.
func (st *stream) handoffServed(e *pool.Endpoint) {
	if e != nil {
		st.ho.h.Served(e)
		st.ho.wd.Served(e.PodKey())
	}
}

// onPrefillFailed handles an async prefill leg's failure: an error answer while the client
// has no status yet, else the stream is reset (the client sees a truncated response).
func (st *stream) onPrefillFailed(e *apierror.Error) (bool, error) {
	st.ho.failed = nil
	if st.finished {
		return false, nil // the response already completed: nothing left to fail
	}
	if !st.ho.sent {
		_, err := st.failRouted(e)
		return true, err
	}
	st.ho.stop()
	st.log.Info("prefill leg failed after the response started; resetting the stream", "reason", e.Reason, "message", e.Message)
	st.finish(e)
	return true, status.Error(codes.Unavailable, e.Message)
}

// onWatchdog runs when the hand-off's timer fires: the response headers hold ended, or the
// watchdog's deadline passed.
func (st *stream) onWatchdog(now time.Time) (bool, error) {
	st.ho.timerOn = false
	if st.ho.held != nil && !now.Before(st.ho.holdUntil) {
		if err := st.flushHeld(); err != nil {
			return true, err
		}
	}
	v, fired := st.ho.wd.Expired(now)
	if !fired {
		st.ho.rearm()
		return false, nil
	}
	if o, ok := st.srv.obs.(HandoffObserver); ok {
		o.DecodeWatchdog(st.ho.model, string(v.Phase))
	}
	st.ho.h.AbortDecode(v.AbortReason)
	st.log.Info("decode watchdog fired", "phase", v.Phase, "timeout", v.Timeout.String(), "path", st.path,
		"headersSent", st.ho.sent)
	if v.Error != nil && !st.ho.sent {
		_, err := st.failRouted(v.Error)
		return true, err
	}
	e := &apierror.Error{Status: http.StatusGatewayTimeout, Type: "timeout", Header: apierror.HeaderPDDecode,
		Reason:  ReasonDecodeWatchdog,
		Message: "decode pod stalled (" + string(v.Phase) + " after " + v.Timeout.String() + "); response cut short"}
	st.finish(e)
	return true, status.Error(codes.DeadlineExceeded, e.Message)
}

// flushHeld sends the held response headers answer, if any.
func (st *stream) flushHeld() error {
	if st.ho.held == nil {
		return nil
	}
	held := st.ho.held
	st.ho.held, st.ho.sent, st.respSent = nil, true, true
	st.ho.wd.Headers()
	return st.send(held)
}

// endHandoff ends the hand-off on every path (cancelling a prefill leg still running).
func (st *stream) endHandoff() {
	if st.ho.active() {
		st.ho.stop()
		st.ho.h.Done()
	}
}
