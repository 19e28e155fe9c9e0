package extproc

import (
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync/atomic"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/proof"
)

// DefaultMaxBodyBytes is the request body limit when Options.MaxBodyBytes is zero (lwepp's).
const DefaultMaxBodyBytes = 10 << 20

// ErrStreamEnded is what Lifecycle.Done receives when the ext_proc stream closed (the client
// half-closed or the gateway stopped sending) before the end of the response was seen and
// before the response was complete by its content (ending.go). Before the response headers
// the error also matches context.Canceled: the caller's ending.
var ErrStreamEnded = errors.New("ext_proc stream ended before the response was complete")

// Options configure the ext_proc server.
type Options struct {
	// MaxBodyBytes is the largest request body accepted; above it the client gets a 413.
	// Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int
	// ConformanceMode honours the test-epp-endpoint-selection request header and echoes the
	// served endpoint in x-conformance-test-served-endpoint, as the upstream conformance
	// suite expects. Off in production: the header is then stripped and ignored.
	ConformanceMode bool
	// DebugTraceHeader returns each decision's trace (JSON) in the x-tandem-trace response header.
	DebugTraceHeader bool
	Logger           logr.Logger
	// Observer, when non-nil, receives stream, decision and error events for metrics. When it
	// also implements HandoffObserver it receives the "epp" hand-off's watchdog events.
	Observer Observer
	// Handoff runs the prefill leg of PD decisions whose Decision.Handoff is "epp". Without
	// it such decisions are answered 503 naming the setting.
	Handoff *handoff.Adapters
	// ResponseHeaderHold is how long, in the epp hand-off, the decode pod's response headers
	// may be held back waiting for its first body chunk, so that a decode pod that sends
	// headers and then stalls (SGLang streams do) still gets the client a clean 504 from the
	// watchdog rather than a cut stream. Keep it below the gateway's ext_proc message timeout.
	// Zero means DefaultResponseHeaderHold; negative disables holding.
	ResponseHeaderHold time.Duration
	// Limits bound the streams and request-body memory the server holds; zero fields take
	// their defaults.
	Limits Limits
	// TrustClientPDFields forwards client-sent PD control fields (request.ControlFields)
	// instead of removing them. Only for clients that are part of the serving system.
	TrustClientPDFields bool
	// Client says what the gateway applies of an answer: config.ClientFull,
	// config.ClientDestinationOnly, or config.ClientAuto ("" too): detected per stream (see
	// destinationOnlyClient).
	Client string
	// Fallbacks says whether the destination lists fallbacks: config.FallbacksOn,
	// config.FallbacksOff, or config.FallbacksAuto ("" too): not for destination-only clients.
	Fallbacks string
	// DestinationOnlyHold is how long a request routed for a destination-only client keeps
	// its decision's trackers and ledger charges after its stream ended (such a client never
	// sends the response phase). Zero releases them at the end of the stream.
	DestinationOnlyHold time.Duration
	// Outcomes is the strategies' recorder (picker.Deps.Outcomes): the server reports into each
	// decision's Route what only it knows (failures classified, the endpoint that served), and
	// starts the route here for a decision whose strategy started none. Nil: such decisions
	// record nothing.
	Outcomes *outcome.Recorder
	// Health, when set, cancels a sync prefill leg whose pod is ejected while it runs, so
	// the pair-level retry can try another pick at once.
	Health *health.Detector
	// Retry is the epp hand-off's pair-level retry and its budget; the zero value retries nothing.
	Retry config.Retry
	// Transfer, when set, judges every PD request's KV transfer from its decode answer
	// (transfer.go) and holds the per decode pod state of the proof; nil judges nothing.
	// Prefill, when set, predicts prefill times for the timing evidence.
	Transfer *proof.Gate
	Prefill  PrefillTimes
	// TransferHeader adds x-tandem-pd-transfer to PD responses whose verdict is known before
	// their headers go out (TANDEM_PD_TRANSFER_HEADER).
	TransferHeader bool
}

// DefaultResponseHeaderHold is Options.ResponseHeaderHold when zero: well under the 60s ext_proc
// message timeout of the Envoy Gateway manifests.
const DefaultResponseHeaderHold = 5 * time.Second

// Server implements the Endpoint Picker Protocol as an ext_proc ExternalProcessorServer.
// Each Process call handles one HTTP request; calls run concurrently and share nothing
// but the pool store and the scheduler.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	store   *pool.Store
	sched   picker.Scheduler
	opts    Options
	limits  Limits
	adm     *admission
	retries *retryBudget
	obs     Observer
	log     logr.Logger

	warnedMode   atomic.Bool
	warnedFields atomic.Bool
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// NewServer returns the ext_proc server picking from store with sched. A nil sched means
// picker.LeastRequest over a tracker of its own.
func NewServer(store *pool.Store, sched picker.Scheduler, opts Options) *Server {
	if sched == nil {
		sched = &picker.LeastRequest{Load: load.NewTracker()}
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.ResponseHeaderHold == 0 {
		opts.ResponseHeaderHold = DefaultResponseHeaderHold
	}
	obs := opts.Observer
	if obs == nil {
		obs = nopObserver{}
	}
	limits := opts.Limits.withDefaults()
	return &Server{store: store, sched: sched, opts: opts, limits: limits, adm: &admission{limits: limits},
		retries: newRetryBudget(opts.Retry), obs: obs, log: opts.Logger.WithName("extproc")}
}

// BufferedBodyBytes is how many request-body bytes the open streams hold now.
func (s *Server) BufferedBodyBytes() int64 { return s.adm.bytes.Load() }

// OpenStreams is how many streams the server is handling now (refused ones excluded).
func (s *Server) OpenStreams() int64 { return s.adm.streams.Load() }

// Process runs one ext_proc stream. Request-level failures are answered with an
// ImmediateResponse; the stream itself ends with an error only when the gateway breaks the
// protocol, the transport fails, or an "epp" hand-off must cut a response already under way.
// A panic while handling the stream ends that stream only (see stream.run); a stream over
// Limits.MaxStreams is answered 429 at once.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) (err error) {
	s.obs.StreamOpened()
	defer s.obs.StreamClosed()
	if !s.adm.enter() {
		return s.refuseStream(srv)
	}
	defer s.adm.leave()
	st := &stream{srv: s, send: srv.Send, ctx: srv.Context(), log: s.log}
	defer func() { st.close(err) }()
	return st.run(srv)
}

// run is the stream's loop. Recv runs in its own goroutine feeding a channel, so the loop can
// also wait on the hand-off's prefill leg (failure, success), the decode watchdog's deadline
// and the request body's deadline. A panic anywhere in the loop is recovered here: the request
// is answered 500 if the client has no response yet, else the stream is reset.
func (st *stream) run(srv extprocv3.ExternalProcessor_ProcessServer) (err error) {
	msgs := make(chan received)
	quit := make(chan struct{})
	defer close(quit)
	defer func() {
		if r := recover(); r != nil {
			err = st.panicked(r, debug.Stack())
		}
	}()
	go func() {
		defer func() {
			if r := recover(); r != nil {
				st.srv.recovered("extproc_recv", r, debug.Stack())
				select {
				case msgs <- received{err: status.Error(codes.Internal, "ext_proc receive failed")}:
				case <-quit:
				}
			}
		}()
		for {
			m, rerr := srv.Recv()
			select {
			case msgs <- received{m, rerr}:
			case <-quit:
				return
			}
			if rerr != nil {
				return
			}
		}
	}()
	var headersDue <-chan time.Time // the request headers' deadline, until they arrive
	if d := st.srv.limits.RequestHeadersTimeout; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		headersDue = t.C
	}
	for {
		var (
			stop bool
			herr error
		)
		if st.gotHeaders {
			headersDue = nil
		}
		select {
		case <-headersDue:
			return status.Errorf(codes.DeadlineExceeded, "no request headers within %s (--request-headers-timeout): the stream is closed to free its slot",
				st.srv.limits.RequestHeadersTimeout)
		case r := <-msgs:
			if r.err != nil {
				return st.recvFailed(r.err)
			}
			stop, herr = st.handle(r.msg)
		case <-st.bodyTimeout():
			stop, herr = st.onBodyTimeout()
		case aerr := <-st.ho.failed:
			stop, herr = st.onPrefillFailed(aerr)
		case <-st.ho.succeeded:
			st.ho.succeeded = nil
			st.ho.wd.Arm(time.Now())
			st.ho.rearm()
		case <-st.ho.timerC():
			stop, herr = st.onWatchdog(time.Now())
		}
		if herr != nil || stop {
			return herr
		}
	}
}

// close ends the stream's lifecycle and hand-off and returns its memory, on every path. The
// lifecycle ends with the stream's error, or ErrStreamEnded when it ended without one (a no-op
// when the response already completed).
func (st *stream) close(err error) {
	defer func() {
		if r := recover(); r != nil { // a lifecycle or hand-off that panics while ending
			st.srv.recovered("extproc_close", r, debug.Stack())
		}
	}()
	st.stopBodyTimer()
	st.releaseBody()
	defer st.leaveActive()
	if err == nil && st.holdUnobserved() {
		st.endHandoff()
		return
	}
	switch {
	case err == nil:
		err = st.earlyEnd(ErrStreamEnded)
	case st.ctx.Err() != nil:
		// The gateway reset the stream (a send failed on it): the same early end.
		err = st.earlyEnd(err)
	}
	st.finish(err)
	st.endHandoff()
}

// panicked turns a recovered panic into the stream's last answer: a 500 ImmediateResponse
// (OpenAI-style body, x-error-routing: true) while the client has no response status yet,
// else a reset stream. The lifecycle ends with the error.
func (st *stream) panicked(v any, stack []byte) (err error) {
	st.srv.recovered("extproc_stream", v, stack)
	e := apierror.Panic()
	defer func() {
		if r := recover(); r != nil { // ending the lifecycle or sending panicked as well
			st.srv.recovered("extproc_stream", r, debug.Stack())
			err = status.Error(codes.Internal, e.Message)
		}
	}()
	st.ho.stop()
	st.finish(e)
	switch {
	case st.rejected:
		return nil // the client already has its error answer
	case st.respSent:
		return status.Error(codes.Internal, e.Message)
	}
	st.answered, st.rejected = true, true
	st.srv.obs.RequestFailed(e.Status, e.Reason)
	if err := st.send(errorAnswer(e)); err != nil {
		return err
	}
	return nil
}

// recovered logs a recovered panic with its stack, once, and counts it.
func (s *Server) recovered(where string, v any, stack []byte) {
	s.obs.Panicked(where)
	s.log.Error(fmt.Errorf("panic: %v", v), "recovered a panic; the request it served failed, the server goes on",
		"where", where, "stack", string(stack))
}

// refuseStream answers a stream over Limits.MaxStreams: it waits (briefly) for the request
// headers, answers 429 with Retry-After, and ends the stream.
func (s *Server) refuseStream(srv extprocv3.ExternalProcessor_ProcessServer) error {
	e := apierror.TooManyStreams(s.limits.MaxStreams)
	s.obs.RequestFailed(e.Status, e.Reason)
	got := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				got <- status.Error(codes.Internal, "ext_proc receive failed")
			}
		}()
		m, err := srv.Recv()
		if err == nil && m.GetRequestHeaders() == nil {
			err = violation("the first message of a stream must be request_headers")
		}
		got <- err
	}()
	timer := time.NewTimer(refuseWait)
	defer timer.Stop()
	select {
	case err := <-got:
		if err != nil {
			return err
		}
		return srv.Send(errorAnswer(e))
	case <-timer.C:
		return status.Error(codes.ResourceExhausted, e.Message)
	case <-srv.Context().Done():
		return nil
	}
}

// refuseWait bounds how long a refused stream may keep a goroutine waiting for its headers.
const refuseWait = 5 * time.Second

// received is one Recv result.
type received struct {
	msg *extprocv3.ProcessingRequest
	err error
}

// recvFailed ends the stream after Recv returned err.
func (st *stream) recvFailed(rerr error) (err error) {
	if rerr == io.EOF {
		if st.gotHeaders && !st.answered {
			if st.abandoned() {
				// Half-closed, then reset, before the end of the request: the client left
				// while sending it (Envoy's order). Nothing is decided.
				st.stopBodyTimer()
				return nil
			}
			// A client that half-closes without marking the end of the request still
			// gets its answer: the half-close is the end of the request.
			st.reqEnded = true
			st.stopBodyTimer()
			st.joinBody()
			_, err = st.decide(true, true)
		}
		return err // close ends what was routed (earlyEnd)
	}
	if c := status.Code(rerr); c == codes.Canceled || c == codes.DeadlineExceeded {
		st.finish(st.earlyEnd(rerr))
		return nil // the client went away: nobody is left to report an error to
	}
	return rerr
}

// warnUnstrippable logs, once per server, client PD control fields in a request from a
// destination-only client: it forwards the client's own body, so Tandem's removal does not
// reach the pod. The gateway must strip them (manifests/README.md says where it can).
func (s *Server) warnUnstrippable(fields []string) {
	if s.warnedFields.CompareAndSwap(false, true) {
		s.log.Info("WARNING: a client sent PD control fields through a destination-only gateway, which forwards "+
			"the client's body unchanged: Tandem cannot remove them and the pod receives them. Strip them at the "+
			"gateway or keep such clients out (logged once)", "fields", fields)
	}
}

// warnBodyMode logs, once per server, a gateway whose request body mode cannot work: the
// EPP needs the whole body before it answers the headers, which only FULL_DUPLEX_STREAMED allows.
func (s *Server) warnBodyMode(mode procmodev3.ProcessingMode_BodySendMode) {
	if s.warnedMode.CompareAndSwap(false, true) {
		s.log.Info("WARNING: the gateway sends request bodies in a mode other than FULL_DUPLEX_STREAMED; "+
			"requests will stall. Set request_body_mode and response_body_mode to FULL_DUPLEX_STREAMED "+
			"in the gateway's ext_proc processing mode", "requestBodyMode", mode.String())
	}
}
