package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
)

// exchange is one client request: one ext_proc stream, one upstream request (plus fallbacks).
// Only the goroutine running run writes to the client; pumps read the client and upstream
// bodies and feed the EPP; a receiver turns the EPP's answers into a channel.
type exchange struct {
	g      *Gateway
	w      http.ResponseWriter
	r      *http.Request
	log    logr.Logger
	ctx    context.Context
	cancel context.CancelFunc

	// The stream has its own context so that, after a complete exchange, it can be closed
	// gracefully in the background while the handler returns; until then it is linked to ctx.
	streamCtx    context.Context
	streamCancel context.CancelFunc
	unlink       func() bool

	stream  extprocv3.ExternalProcessor_ProcessClient
	sendMu  sync.Mutex
	msgs    chan *extprocv3.ProcessingResponse
	recvErr error // valid once msgs is closed

	hasBody     bool
	body        *clientBody
	reqHeaders  fields
	wroteHeader bool
	eppLength   bool // the EPP set content-length for the body it streams upstream
	status      int
	served      string

	// Trailers travel from a pump to the main loop through the EPP, which the race detector
	// cannot see, so they are handed over under a lock.
	mu           sync.Mutex
	reqTrailers  http.Header
	respTrailers http.Header
}

// clientBody is what the client sent, kept whole for fail-open.
type clientBody struct {
	done         chan struct{} // closed once the client body is read (or failed)
	data         []byte
	err          error
	trailersSent atomic.Bool // the request body ended with a trailers message, not end_of_stream
	read         atomic.Bool // the client's body has been read to its end (it may still be going to the EPP)
}

func newExchange(g *Gateway, w http.ResponseWriter, r *http.Request) *exchange {
	ctx, cancel := context.WithCancel(r.Context())
	streamCtx, streamCancel := context.WithCancel(context.Background())
	x := &exchange{
		g: g, w: w, r: r, ctx: ctx, cancel: cancel,
		streamCtx: streamCtx, streamCancel: streamCancel,
		log:     g.opts.Logger.WithValues("method", r.Method, "path", r.URL.Path),
		msgs:    make(chan *extprocv3.ProcessingResponse, 16),
		hasBody: r.Body != nil && r.Body != http.NoBody,
		body:    &clientBody{done: make(chan struct{})},
	}
	x.unlink = context.AfterFunc(ctx, x.endStream)
	return x
}

// endStream ends the ext_proc stream of an exchange that ends early (the client left, or the
// exchange failed): a reset, preceded in EndEnvoy mode by a half-close, as Envoy's
// ExternalProcessorStreamImpl::close() does (the HTTP/2 frames go out in that order). A send
// in progress (blocked on flow control) leaves no room for the half-close: a plain reset then.
func (x *exchange) endStream() {
	if x.g.opts.StreamEnd == EndEnvoy && x.sendMu.TryLock() {
		if x.stream != nil {
			_ = x.stream.CloseSend()
		}
		x.sendMu.Unlock()
	}
	x.streamCancel()
}

// run drives the exchange; it returns true when the client stream must be cut.
func (x *exchange) run() (abort bool) {
	start := time.Now()
	defer func() {
		x.cleanup()
		x.log.V(1).Info("request", "status", x.status, "served", x.served, "abort", abort, "duration", time.Since(start).String())
	}()
	x.reqHeaders = requestFields(x.r)

	stream, err := x.g.client.Process(x.streamCtx)
	if err != nil {
		x.startBody(false)
		return x.beforeDecision(err)
	}
	x.sendMu.Lock() // endStream may read it from another goroutine
	x.stream = stream
	x.sendMu.Unlock()
	go x.receive()
	sendErr := x.send(headersMsg(true, x.reqHeaders, !x.hasBody, subsetHint(x.g.opts.SubsetHint, x.r)))
	// A failed Send means the stream is broken; its status arrives through receive.
	x.startBody(sendErr == nil)

	decision, abort, stop := x.awaitDecision()
	if stop {
		return abort
	}
	return x.route(decision)
}

func (x *exchange) startBody(toEPP bool) {
	if !x.hasBody {
		close(x.body.done)
		return
	}
	go x.readBody(toEPP)
}

// awaitDecision waits for the answer to the request headers, which an EPP defers until it
// has the whole body.
func (x *exchange) awaitDecision() (decision *extprocv3.ProcessingResponse, abort, stop bool) {
	timer := time.NewTimer(x.g.opts.DecisionTimeout)
	defer timer.Stop()
	for {
		select {
		case m, ok := <-x.msgs:
			if !ok {
				if x.ctx.Err() != nil {
					// The exchange ended first (the client left or its body failed) and so
					// cancelled the stream: the EPP did not fail.
					return nil, x.ended(), true
				}
				return nil, x.beforeDecision(x.recvErr), true
			}
			switch v := m.GetResponse().(type) {
			case nil:
				continue // e.g. a bare mode_override or window update
			case *extprocv3.ProcessingResponse_RequestHeaders:
				return m, false, false
			case *extprocv3.ProcessingResponse_ImmediateResponse:
				x.writeImmediate(v.ImmediateResponse)
				return nil, false, true
			default:
				return nil, x.fail(http.StatusInternalServerError, "ext_proc protocol violation: EPP sent "+kind(m)+" before answering the request headers"), true
			}
		case <-timer.C:
			return nil, x.beforeDecision(fmt.Errorf("no answer to the request headers within %s", x.g.opts.DecisionTimeout)), true
		case <-x.ctx.Done():
			return nil, x.ended(), true
		}
	}
}

// ended answers a client whose exchange ended before the EPP decided: nothing when the client
// left, else why (its body could not be read), never an empty 200.
func (x *exchange) ended() bool {
	if x.r.Context().Err() != nil {
		return false // the client left; nobody to answer
	}
	// The EPP's answer may have arrived as the exchange ended: it wins.
	select {
	case m, ok := <-x.msgs:
		if ir := m.GetImmediateResponse(); ok && ir != nil {
			x.writeImmediate(ir)
			return false
		}
	default:
	}
	// With the client still there, only the body reader ends the exchange (on a read error),
	// and it is about to close body.done.
	<-x.body.done
	if x.body.err != nil {
		return x.fail(http.StatusBadRequest, "reading the request body: "+x.body.err.Error())
	}
	return x.fail(http.StatusInternalServerError, "the exchange ended before the EPP decided")
}

type upstreamResult struct {
	i             int
	resp          *http.Response
	connectFailed bool
	err           error
}

type pumpResult struct {
	trailersSent bool
	err          error
}

// route applies the decision, proxies to the destination (fallbacks on connect failure) and
// relays the response through the EPP to the client.
func (x *exchange) route(decision *extprocv3.ProcessingResponse) bool {
	mutation := decision.GetRequestHeaders().GetResponse().GetHeaderMutation()
	dests, err := destination(mutation, decision.GetDynamicMetadata())
	if err != nil {
		return x.fail(http.StatusInternalServerError, "bad EPP decision: "+err.Error())
	}
	if len(dests) == 0 {
		return x.fail(http.StatusServiceUnavailable, "EPP answered without "+destinationKey+" (header or envoy.lb metadata)")
	}
	x.reqHeaders.mutate(mutation)
	_, x.eppLength = setValue(mutation, "content-length")

	ub := newReplayBody()
	if !x.hasBody {
		ub.finish(nil)
	}
	results := make(chan upstreamResult, 1)
	next := 0
	var (
		timeout       <-chan time.Time // UpstreamTimeout of the attempt in flight, until its headers
		cancelAttempt context.CancelFunc
	)
	try := func() {
		i := next
		next++
		ctx, cancel := context.WithCancel(x.ctx)
		cancelAttempt = cancel
		if t := x.g.opts.UpstreamTimeout; t > 0 {
			timeout = time.After(t)
		}
		go func() {
			resp, connectFailed, err := x.roundTrip(ctx, dests[i], ub, x.reqHeaders)
			results <- upstreamResult{i, resp, connectFailed, err}
		}()
	}
	try()
	defer func() {
		if cancelAttempt != nil && timeout != nil {
			cancelAttempt() // a timed-out attempt still waiting for its headers
		}
	}()

	var (
		respHeaders   fields
		respNoBody    bool
		awaitHeaders  bool
		pumpDone      chan pumpResult
		pumped        *pumpResult
		bodyEnded     bool
		trailersDone  bool
		connectErrors []string
	)
	finished := func() bool {
		switch {
		case !x.wroteHeader || awaitHeaders:
			return false
		case respNoBody:
			return true
		case pumped == nil:
			return false
		case pumped.trailersSent:
			return trailersDone
		}
		return bodyEnded
	}
	for {
		select {
		case <-x.ctx.Done():
			if x.wroteHeader {
				return false
			}
			return x.ended() // the client left, or its body could not be read: never an empty 200
		case <-timeout:
			return x.localReply(http.StatusGatewayTimeout, fmt.Sprintf("upstream request timeout: %s sent no response headers within %s",
				dests[next-1], x.g.opts.UpstreamTimeout))
		case res := <-results:
			if res.err != nil {
				if res.connectFailed {
					connectErrors = append(connectErrors, res.err.Error())
					x.log.Info("upstream connect failed", "endpoint", dests[res.i], "err", res.err)
					if next < len(dests) {
						try()
						continue
					}
					return x.localReply(http.StatusServiceUnavailable, fmt.Sprintf("upstream connect error: none of the %d endpoint(s) accepted a connection: %s",
						len(dests), strings.Join(connectErrors, "; ")))
				}
				return x.localReply(http.StatusBadGateway, fmt.Sprintf("upstream %s: %v", dests[res.i], res.err))
			}
			timeout = nil
			x.served = dests[res.i]
			respHeaders = responseFields(res.resp)
			respNoBody = res.resp.Body == http.NoBody || res.resp.ContentLength == 0
			if respNoBody {
				res.resp.Body.Close()
			}
			awaitHeaders = true
			_ = x.send(headersMsg(false, respHeaders, respNoBody, servedMetadata(x.served)))
			if !respNoBody {
				// FULL_DUPLEX_STREAMED: body chunks go out without waiting for the headers answer.
				pumpDone = make(chan pumpResult, 1)
				go x.pumpResponse(res.resp, pumpDone)
			}
		case p := <-pumpDone:
			pumped = &p
			pumpDone = nil
			if p.err != nil {
				return x.fail(http.StatusBadGateway, fmt.Sprintf("upstream %s broke mid-response: %v", x.served, p.err))
			}
			if finished() {
				return x.complete()
			}
		case m, ok := <-x.msgs:
			if !ok {
				return x.fail(http.StatusInternalServerError, fmt.Sprintf("EPP stream ended after the decision: %v", x.recvErr))
			}
			switch v := m.GetResponse().(type) {
			case nil:
				continue
			case *extprocv3.ProcessingResponse_RequestBody:
				sb := streamed(v.RequestBody)
				if sb == nil {
					return x.fail(http.StatusInternalServerError, "ext_proc protocol violation: request body answer without streamed_response in FULL_DUPLEX_STREAMED mode")
				}
				ub.append(sb.GetBody())
				if sb.GetEndOfStream() && !x.body.trailersSent.Load() {
					ub.finish(nil)
				}
			case *extprocv3.ProcessingResponse_RequestTrailers:
				x.mu.Lock()
				t := fromHTTP(nil, x.reqTrailers)
				x.mu.Unlock()
				t.mutate(v.RequestTrailers.GetHeaderMutation())
				ub.finish(t.httpHeader())
			case *extprocv3.ProcessingResponse_ResponseHeaders:
				if !awaitHeaders {
					return x.fail(http.StatusInternalServerError, "ext_proc protocol violation: response headers answer with no response headers pending")
				}
				awaitHeaders = false
				respHeaders.mutate(v.ResponseHeaders.GetResponse().GetHeaderMutation())
				if !x.writeHeader(respHeaders) {
					return false
				}
				if finished() {
					return x.complete()
				}
			case *extprocv3.ProcessingResponse_ResponseBody:
				sb := streamed(v.ResponseBody)
				if sb == nil || !x.wroteHeader {
					return x.fail(http.StatusInternalServerError, "ext_proc protocol violation: response body answer out of order or without streamed_response")
				}
				if !bodyEnded && len(sb.GetBody()) > 0 {
					if _, err := x.w.Write(sb.GetBody()); err != nil {
						return false // client gone
					}
					_ = http.NewResponseController(x.w).Flush()
				}
				if sb.GetEndOfStream() {
					bodyEnded = true
				}
				if finished() {
					return x.complete()
				}
			case *extprocv3.ProcessingResponse_ResponseTrailers:
				if !x.wroteHeader {
					return x.fail(http.StatusInternalServerError, "ext_proc protocol violation: response trailers answer before response headers")
				}
				x.mu.Lock()
				t := fromHTTP(nil, x.respTrailers)
				x.mu.Unlock()
				t.mutate(v.ResponseTrailers.GetHeaderMutation())
				for k, vs := range t.httpHeader() {
					for _, s := range vs {
						x.w.Header().Add(http.TrailerPrefix+k, s)
					}
				}
				trailersDone = true
				if finished() {
					return x.complete()
				}
			case *extprocv3.ProcessingResponse_ImmediateResponse:
				if x.wroteHeader {
					x.log.Info("immediate response after the response started: cutting the stream")
					return true
				}
				x.writeImmediate(v.ImmediateResponse)
				return false
			default:
				return x.fail(http.StatusInternalServerError, "ext_proc protocol violation: unexpected "+kind(m))
			}
		}
	}
}

// roundTrip sends the request to one endpoint; connectFailed tells a refused or timed-out
// connect (try the next fallback) from any later failure.
func (x *exchange) roundTrip(ctx context.Context, endpoint string, ub *replayBody, h fields) (*http.Response, bool, error) {
	a := &attempt{}
	ctx = context.WithValue(ctx, attemptKey{}, a)
	path, _ := h.get(":path")
	if path == "" {
		path = x.r.URL.RequestURI()
	}
	var trailer http.Header
	if len(x.r.Trailer) > 0 {
		trailer = make(http.Header, len(x.r.Trailer))
		for k := range x.r.Trailer {
			trailer[k] = nil
		}
	}
	var body io.ReadCloser = http.NoBody
	if x.hasBody {
		body = ub.reader(trailer)
	}
	req, err := http.NewRequestWithContext(ctx, x.r.Method, "http://"+endpoint+path, body)
	if err != nil {
		return nil, false, err
	}
	req.Host = x.r.Host
	req.Header = h.httpHeader()
	req.Header.Del("Content-Length")
	req.Trailer = trailer
	if x.hasBody {
		// The EPP may replace the body; its length is known only if the EPP says so.
		req.ContentLength = -1
		if v, ok := h.get("content-length"); ok && trailer == nil && x.eppLength {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				req.ContentLength = n
			}
		}
		req.GetBody = func() (io.ReadCloser, error) { return ub.reader(trailer), nil }
	}
	resp, err := x.g.transport.RoundTrip(req)
	if err != nil {
		var op *net.OpError
		return nil, a.connectFailed.Load() || (errors.As(err, &op) && op.Op == "dial"), err
	}
	return resp, false, nil
}
