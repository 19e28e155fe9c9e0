package extproc

import (
	"errors"
	"io"
	"sync/atomic"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// DefaultMaxBodyBytes is the request body limit when Options.MaxBodyBytes is zero (lwepp's).
const DefaultMaxBodyBytes = 10 << 20

// ErrStreamEnded is what Lifecycle.Done receives when the ext_proc stream closed (the client
// half-closed or the gateway stopped sending) before the end of the response was seen.
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
}

// DefaultResponseHeaderHold is Options.ResponseHeaderHold when zero: well under the 60s ext_proc
// message timeout of the Envoy Gateway manifests.
const DefaultResponseHeaderHold = 5 * time.Second

// Server implements the Endpoint Picker Protocol as an ext_proc ExternalProcessorServer.
// Each Process call handles one HTTP request; calls run concurrently and share nothing
// but the pool store and the scheduler.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	store *pool.Store
	sched picker.Scheduler
	opts  Options
	obs   Observer
	log   logr.Logger

	warnedMode atomic.Bool
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
	return &Server{store: store, sched: sched, opts: opts, obs: obs, log: opts.Logger.WithName("extproc")}
}

// Process runs one ext_proc stream. Request-level failures are answered with an
// ImmediateResponse; the stream itself ends with an error only when the gateway breaks the
// protocol, the transport fails, or an "epp" hand-off must cut a response already under way.
//
// Recv runs in its own goroutine feeding a channel, so the loop can also wait on the
// hand-off's prefill leg (failure, success) and on the decode watchdog's deadline.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) (err error) {
	s.obs.StreamOpened()
	defer s.obs.StreamClosed()
	st := &stream{srv: s, send: srv.Send, ctx: srv.Context(), log: s.log}
	defer func() {
		if err == nil {
			st.finish(ErrStreamEnded) // a no-op when the response already completed
		} else {
			st.finish(err)
		}
		st.endHandoff()
	}()
	msgs := make(chan received)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
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
	for {
		var (
			stop bool
			herr error
		)
		select {
		case r := <-msgs:
			if r.err != nil {
				return st.recvFailed(r.err)
			}
			stop, herr = st.handle(r.msg)
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

// received is one Recv result.
type received struct {
	msg *extprocv3.ProcessingRequest
	err error
}

// recvFailed ends the stream after Recv returned err.
func (st *stream) recvFailed(rerr error) (err error) {
	if rerr == io.EOF {
		if st.gotHeaders && !st.answered {
			// A client that half-closes without marking the end of the request still
			// gets its answer: the half-close is the end of the request.
			st.reqEnded = true
			_, err = st.decide(true, true)
		}
		return err
	}
	if c := status.Code(rerr); c == codes.Canceled || c == codes.DeadlineExceeded {
		st.finish(rerr)
		return nil // the client went away: nobody is left to report an error to
	}
	return rerr
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
