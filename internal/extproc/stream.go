package extproc

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// stream is the state of one ext_proc stream, which carries one HTTP request and its
// response. It is used by one goroutine only.
//
// Request side: headers are stored and the answer deferred until the request has ended
// (end_of_stream on the headers, on a body chunk, or trailers); then Tandem decides and
// sends the route followed by the body. Response side: every message is answered at once.
type stream struct {
	srv  *Server
	send func(*extprocv3.ProcessingResponse) error
	ctx  context.Context
	log  logr.Logger

	gotHeaders bool
	method     string
	path       string
	headers    map[string]string // lower-case keys, client control headers removed
	strip      []string          // client control headers the upstream request must not carry
	subset     selection
	testSel    selection
	// destOnly: the client applies only the destination header (one host:port) and sends no
	// response phase (Options.Client, or detected); fallbacks: the destination lists them.
	destOnly  bool
	fallbacks bool
	// The request body: chunks as received (kept, not copied: each message's bytes are its
	// own), joined into body once the request ended. reserved is its share of the server's
	// body budget, returned as soon as the body has been forwarded or dropped.
	chunks      [][]byte
	size        int
	body        []byte
	reserved    int64
	bodyChanged bool        // the body forwarded differs from the client's: content-length is set
	bodyTimer   *time.Timer // Limits.RequestBodyTimeout, while the body arrives
	reqEnded    bool        // the whole request has been received
	answered    bool        // the route or an ImmediateResponse has been sent
	rejected    bool        // an ImmediateResponse was sent; the rest of the request is drained unanswered

	decision    *picker.Decision
	lifecycle   picker.Lifecycle
	respHeaders bool // response headers seen (Lifecycle.ResponseHeaders is called at most once)
	// resp follows the response's content, to tell a complete response from one cut short
	// when the gateway ends the stream before its end_of_stream (ending.go).
	resp     responseProgress
	respSent bool // the response headers answer went out: the client has a status
	finished bool

	ho eppHandoff // the "epp" hand-off, when the decision has one
	// xfer follows a PD decode answer for the proof of its KV transfer (transfer.go);
	// prefillLeg is how long a sync prefill leg took, promptTokens the request's estimate,
	// served the destination the gateway reported serving (nil: none, or not one of them).
	xfer         transfer
	prefillLeg   time.Duration
	promptTokens int
	served       *pool.Endpoint

	// route records the decision's outcome (internal/outcome); nil records nothing. ownRoute:
	// the server started it (the strategy did not), so it writes the chunks too.
	route    *outcome.Tracker
	ownRoute bool
	// retrying: this stream's second attempt holds one of the retry budget's slots;
	// firstFailure is the failure of the attempt it retries.
	retrying     bool
	firstFailure *apierror.Error
	// active: the stream counts among the routed requests in flight (the retry budget's base).
	active bool
}

// violation is a gRPC error for a gateway that breaks the ext_proc protocol: not a
// request-level error, so the stream ends.
func violation(format string, args ...any) error {
	return status.Errorf(codes.FailedPrecondition, "ext_proc protocol violation: "+format, args...)
}

// handle processes one message. stop means the stream has nothing more to do.
func (st *stream) handle(msg *extprocv3.ProcessingRequest) (stop bool, err error) {
	switch msg.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders, *extprocv3.ProcessingRequest_ResponseBody,
		*extprocv3.ProcessingRequest_ResponseTrailers:
		if !st.answered {
			// Nothing was routed yet, so there is no response: taking it as one would end the
			// stream's accounting before a decision exists, and that decision would never end.
			return true, violation("a response message before the request was answered")
		}
	}
	switch m := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.onRequestHeaders(msg, m.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.onRequestBody(m.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.onRequestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return false, st.onResponseHeaders(msg, m.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		err := st.onResponseBody(m.ResponseBody)
		return st.rejected, err // rejected: the strict transfer proof answered with an error
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.judgeTransfer()
		if err := st.flushHeld(); err != nil {
			return true, err
		}
		st.ho.stop()
		st.finish(nil)
		return false, st.send(trailersAnswer(true))
	}
	return false, nil // e.g. a flow-control-only message: nothing to answer
}

// isControlHeader reports request headers only the gateway or Tandem may set.
func (st *stream) isControlHeader(key string) bool {
	switch {
	case strings.HasPrefix(key, wire.HeaderDestination): // destination, -served, -subset, -fallback(s)
		return true
	case key == wire.HeaderPrefillerHostPort, key == wire.HeaderEncoderHostsPorts, key == wire.HeaderDataParallelHostPort:
		return true
	case key == wire.HeaderTestSelection:
		return !st.srv.opts.ConformanceMode
	}
	return false
}

func (st *stream) onRequestHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.gotHeaders {
		return true, violation("a second request_headers message; ext_proc carries one HTTP request per stream")
	}
	st.gotHeaders = true
	if pc := msg.GetProtocolConfig(); pc != nil && !h.GetEndOfStream() &&
		pc.GetRequestBodyMode() != procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED {
		st.srv.warnBodyMode(pc.GetRequestBodyMode())
	}

	st.headers = joinHeaders(h.GetHeaders().GetHeaders())
	st.method, st.path = st.headers[":method"], st.headers[":path"]
	st.destOnly, st.fallbacks = st.srv.clientKind(h.GetHeaders().GetHeaders())
	for key := range st.headers {
		if st.isControlHeader(key) {
			st.strip = append(st.strip, key)
		}
	}
	slices.Sort(st.strip)
	if st.srv.opts.ConformanceMode {
		if v := st.headers[wire.HeaderTestSelection]; strings.TrimSpace(v) != "" {
			st.testSel = selection{present: true, entries: splitList(nil, v)}
		}
	}
	for _, key := range st.strip {
		delete(st.headers, key) // schedulers never see client-chosen control values
	}
	st.subset = subsetHint(msg.GetMetadataContext())

	if h.GetEndOfStream() {
		st.reqEnded = true
		return st.decide(false, false)
	}
	if t := st.srv.limits.RequestBodyTimeout; t > 0 {
		st.bodyTimer = time.NewTimer(t)
	}
	return false, nil
}

// bodyTimeout fires when the body is late: Limits.RequestBodyTimeout after the headers.
func (st *stream) bodyTimeout() <-chan time.Time {
	if st.bodyTimer == nil {
		return nil
	}
	return st.bodyTimer.C
}

// onBodyTimeout refuses a request whose body did not arrive in time.
func (st *stream) onBodyTimeout() (bool, error) {
	st.stopBodyTimer()
	if st.reqEnded || st.answered {
		return false, nil
	}
	return st.refuse(apierror.BodyTimeout(st.srv.limits.RequestBodyTimeout))
}

func (st *stream) stopBodyTimer() {
	if st.bodyTimer != nil {
		st.bodyTimer.Stop()
		st.bodyTimer = nil
	}
}

func (st *stream) onRequestBody(b *extprocv3.HttpBody) (bool, error) {
	if !st.gotHeaders {
		return true, violation("request_body before request_headers")
	}
	if st.reqEnded {
		if st.rejected {
			return true, nil
		}
		return true, violation("request_body after the request ended")
	}
	if b.GetEndOfStream() {
		st.reqEnded = true
		st.stopBodyTimer()
	}
	if st.rejected { // draining after a 413
		return st.reqEnded, nil
	}
	chunk := b.GetBody()
	if limit := st.srv.opts.MaxBodyBytes; st.size+len(chunk) > limit {
		st.releaseBody()
		return st.reject(apierror.TooLarge(limit))
	}
	if len(chunk) > 0 {
		// A body that arrives whole in one message is parsed and forwarded at once, never
		// held waiting for more: it always gets in (and counts while it is held).
		whole := st.size == 0 && st.reqEnded
		if !st.srv.adm.reserve(int64(len(chunk)), whole) {
			st.releaseBody()
			return st.refuse(apierror.BodyBudget(st.srv.limits.MaxBufferedBodyBytes))
		}
		st.reserved += int64(len(chunk))
		// The full slice expression makes a later append (a strategy's) copy instead of
		// writing past the message's bytes.
		st.chunks = append(st.chunks, chunk[:len(chunk):len(chunk)])
		st.size += len(chunk)
	}
	if st.reqEnded {
		st.joinBody()
		return st.decide(true, true)
	}
	return false, nil
}

// joinBody makes the received chunks one body. Most bodies arrive in one chunk, which is used
// as it is.
func (st *stream) joinBody() {
	switch len(st.chunks) {
	case 0:
	case 1:
		st.body = st.chunks[0]
	default:
		st.body = bytes.Join(st.chunks, nil)
	}
	st.chunks = nil
}

// releaseBody drops the request body and returns its share of the budget.
func (st *stream) releaseBody() {
	st.chunks, st.body, st.size = nil, nil, 0
	st.srv.adm.release(st.reserved)
	st.reserved = 0
}

func (st *stream) onRequestTrailers() (bool, error) {
	if !st.gotHeaders {
		return true, violation("request_trailers before request_headers")
	}
	wasEnded := st.reqEnded
	st.reqEnded = true
	if st.rejected {
		return true, nil
	}
	if !wasEnded {
		// Trailers end a request whose last body chunk did not say end_of_stream.
		st.stopBodyTimer()
		st.joinBody()
		if stop, err := st.decide(true, false); stop || err != nil || st.rejected {
			return stop, err
		}
	}
	return false, st.send(trailersAnswer(false))
}

// reject answers with an ImmediateResponse. The stream stops once the request has been
// received entirely; until then the remaining messages are drained unanswered.
func (st *stream) reject(e *apierror.Error) (bool, error) {
	st.srv.obs.RequestFailed(e.Status, e.Reason)
	st.log.V(1).Info("request rejected", "status", e.Status, "reason", e.Reason, "message", e.Message, "path", st.path)
	st.rejected, st.answered = true, true
	if err := st.send(errorAnswer(e)); err != nil {
		return true, err
	}
	return st.reqEnded, nil
}

// refuse answers a request over one of the server's limits with an ImmediateResponse and ends
// the stream at once: nothing more of it is read or held.
func (st *stream) refuse(e *apierror.Error) (bool, error) {
	st.releaseBody()
	st.stopBodyTimer()
	st.srv.obs.RequestFailed(e.Status, e.Reason)
	st.log.V(1).Info("request refused", "status", e.Status, "reason", e.Reason, "path", st.path)
	st.rejected, st.answered = true, true
	return true, st.send(errorAnswer(e))
}

// candidates is the part of the pool this request for model may reach: the gateway's subset
// hint (or the test header), then the pods of the model (pool.ForModel; without a hint the
// snapshot's own view of the model, made once).
func (st *stream) candidates(snap *pool.Snapshot, model string) ([]*pool.Endpoint, *apierror.Error) {
	if len(snap.Endpoints) == 0 {
		if !snap.Synced {
			return nil, apierror.Unavailable("no_endpoint",
				"the inference pool has not been read (yet): check that the InferencePool exists in the namespace Tandem watches (Tandem's log says when it is not found)")
		}
		return nil, apierror.Unavailable("no_endpoint",
			"the inference pool has no ready endpoints; check the pool's selector and that its pods are Ready")
	}
	sel, what := st.subset, "the gateway's subset hint ("+wire.MetadataNamespaceSubset+"/"+wire.MetadataKeySubset+")"
	if st.testSel.present {
		sel, what = st.testSel, "the "+wire.HeaderTestSelection+" header"
	}
	if !sel.present {
		return snap.OfModel(model), nil
	}
	cands := sel.filter(snap)
	if len(cands) == 0 {
		return nil, apierror.Unavailable("subset_empty",
			"no endpoint of the inference pool is in %s: %q", what, strings.Join(sel.entries, ","))
	}
	return pool.ForModel(cands, model), nil
}

// decide answers the complete request: parse, pick, hand-off, answer. hasBody says body chunks
// are expected back; bodyEOS whether the last carries end_of_stream (false when trailers
// follow). Whatever happens, the body's share of the budget is returned before it returns.
// In the epp hand-off a prefill leg that fails before anything reached the client may be
// retried once on another pick (retryPrefill).
func (st *stream) decide(hasBody, bodyEOS bool) (bool, error) {
	defer st.releaseBody()
	start := time.Now()
	req, aerr := st.parse(hasBody)
	if aerr != nil {
		return st.reject(aerr)
	}
	d, cands, aerr := st.pick(req, nil)
	if aerr != nil {
		return st.reject(aerr)
	}
	parsed := st.body
	for attempt := 1; ; attempt++ {
		mode, body, aerr := st.routeDecision(req, d, cands, hasBody, start)
		if aerr == nil {
			if attempt > 1 {
				st.retryObserved(RetryRecovered)
			}
			return st.answer(req, d, mode, body, hasBody, bodyEOS)
		}
		next, nextCands := st.retryPrefill(req, d, cands, aerr, attempt)
		if next == nil {
			return st.failRouted(st.bothAttempts(aerr))
		}
		d, cands, start = next, nextCands, time.Now()
		st.body = parsed
	}
}

// routeDecision adopts a decision and prepares its answer: the destination-only client's
// whole route, the hand-off mode, PD-safe fallbacks, the outcome record, and the hand-off.
func (st *stream) routeDecision(req *request.Request, d *picker.Decision, cands []*pool.Endpoint, hasBody bool, start time.Time) (string, []byte, *apierror.Error) {
	if st.destOnly {
		routeWhole(d)
	}
	st.decision, st.lifecycle, st.finished = d, d.Lifecycle, false
	st.srv.obs.Decided(DecisionEvent{Strategy: d.Strategy, Outcome: d.Outcome, Step: d.Step,
		Latency: time.Since(start), Candidates: len(cands)})
	st.enterActive()
	mode := st.srv.handoffMode(d, hasBody)
	if mode == config.HandoffEPP {
		d.Destination = eppFallbacks(d.Destination)
	}
	st.startRoute(req, d, mode)
	body, aerr := st.handOff(req, d, cands, mode, hasBody)
	return mode, body, aerr
}

// parse reads the whole request (request.ParseWith: validation, safe strings, client PD
// control fields removed). The body forwarded from here on is the parsed one.
func (st *stream) parse(hasBody bool) (*request.Request, *apierror.Error) {
	if hasBody {
		st.srv.obs.RequestBody(len(st.body))
	}
	req, err := request.ParseWith(st.method, st.path, st.headers, st.body,
		request.Options{TrustPDFields: st.srv.opts.TrustClientPDFields})
	if err != nil {
		return nil, apierror.From(err)
	}
	if req.RemovedFields != nil {
		if st.destOnly {
			st.srv.warnUnstrippable(req.RemovedFields)
		}
		st.srv.obs.FieldsRemoved(req.RemovedFields)
		if l := st.log.V(1); l.Enabled() {
			l.Info("removed client-sent PD control fields", "fields", req.RemovedFields, "path", st.path)
		}
		st.body, st.bodyChanged = req.Body, true
	}
	return req, nil
}

// pick schedules the request among its candidates, but for those in exclude (a retry's
// failed prefill pod).
func (st *stream) pick(req *request.Request, exclude map[*pool.Endpoint]bool) (*picker.Decision, []*pool.Endpoint, *apierror.Error) {
	snap := st.srv.store.Load()
	cands, aerr := st.candidates(snap, req.Model)
	if aerr != nil {
		return nil, nil, aerr
	}
	if len(exclude) > 0 {
		cands = slices.DeleteFunc(slices.Clone(cands), func(e *pool.Endpoint) bool { return exclude[e] })
		if len(cands) == 0 {
			return nil, nil, apierror.Unavailable("no_endpoint", "no candidate is left once the failed prefill pod is excluded")
		}
	}
	ctx := st.ctx
	if len(exclude) > 0 {
		ctx = picker.WithRetry(ctx)
	}
	d, err := st.srv.sched.Schedule(ctx, req, snap, cands)
	if err == nil && (d == nil || len(d.Destination) == 0) {
		if d != nil && d.Lifecycle != nil {
			d.Lifecycle.Done(ErrStreamEnded)
		}
		err = apierror.Unavailable("no_endpoint", "the scheduler chose no endpoint among %d candidates", len(cands))
	}
	if err != nil {
		return nil, nil, apierror.From(err)
	}
	return d, cands, nil
}

// handOff returns the body to forward: the decision's (a strategy's mutation), or in the "epp"
// hand-off the decode body after Tandem started (sync engines: ran) the prefill leg.
func (st *stream) handOff(req *request.Request, d *picker.Decision, cands []*pool.Endpoint, mode string, hasBody bool) ([]byte, *apierror.Error) {
	body := st.body
	if d.Body != nil {
		if hasBody {
			body, st.bodyChanged = d.Body, true
		} else {
			st.log.V(1).Info("ignoring a body mutation for a request without a body", "strategy", d.Strategy)
		}
	}
	if mode != config.HandoffEPP {
		return body, nil
	}
	st.body = body
	decodeBody, aerr := st.startHandoff(req, d)
	if aerr != nil {
		return nil, aerr
	}
	st.bodyChanged = true
	return decodeBody, nil
}

// answer sends the route, then the body.
func (st *stream) answer(req *request.Request, d *picker.Decision, mode string, body []byte, hasBody, bodyEOS bool) (bool, error) {
	r := route{Destination: make([]string, len(d.Destination)), PrimaryOnly: !st.fallbacks, SetHeaders: d.SetHeaders,
		EPP: mode == config.HandoffEPP, Strip: st.strip, BodyLength: -1, Conformance: st.srv.opts.ConformanceMode}
	for i, e := range d.Destination {
		r.Destination[i] = e.HostPort()
	}
	if mode != "" {
		r.Prefill = d.Prefill[0].HostPort()
	}
	if hasBody && st.bodyChanged {
		r.BodyLength = len(body)
	}
	if l := st.log.V(1); l.Enabled() { // the hot path: build no log arguments unless asked
		l.Info("routed", "destination", strings.Join(r.Destination, ","), "strategy", d.Strategy, "step", d.Step,
			"api", req.API, "model", req.Model, "bodyBytes", len(body))
	}
	st.answered = true
	st.body = nil
	st.startTransfer(mode)
	if st.ho.active() {
		st.ho.rearm() // sync engines: the prefill leg already succeeded, the watchdog is armed
	}
	if err := st.send(buildRoute(r)); err != nil {
		return true, err
	}
	if hasBody {
		for _, chunk := range chunkedBody(body, bodyEOS) {
			if err := st.send(chunk); err != nil {
				return true, err
			}
		}
	}
	return false, nil
}

func (st *stream) onResponseHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	code := 0
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			v := hv.GetValue()
			if len(hv.GetRawValue()) > 0 {
				v = string(hv.GetRawValue())
			}
			code, _ = strconv.Atoi(v)
		}
	}
	served, missing := servedEndpoint(msg.GetMetadataContext())
	// The gateway names the endpoint that answered by host:port; it is looked up among the
	// decision's destinations once, here, for every reader below.
	var servedEP *pool.Endpoint
	if st.decision != nil {
		servedEP = pool.Served(st.decision.Destination, served)
	}
	if st.ho.active() && st.ho.status == 0 {
		st.ho.status = code
	}
	var set []*corev3.HeaderValueOption
	if d := st.decision; d != nil {
		if !st.respHeaders {
			st.resp.headers(joinHeaders(h.GetHeaders().GetHeaders()))
		}
		if !st.respHeaders {
			st.routeResponse(code, served, servedEP)
			st.xfer.status, st.served = code, servedEP
		}
		if st.lifecycle != nil && !st.respHeaders && !st.finished {
			st.lifecycle.ResponseHeaders(code, servedEP)
		}
		st.respHeaders = true
		set = headerOptions(set, d.ResponseHeaders)
		if st.srv.opts.DebugTraceHeader && d.Trace != nil {
			if b, err := json.Marshal(d.Trace); err == nil {
				set = append(set, headerOption(wire.HeaderTrace, string(b)))
			}
		}
	}
	if st.srv.opts.ConformanceMode {
		if served == "" {
			served = missing
		}
		set = append(set, headerOption(wire.HeaderTestServed, served))
	}
	answer := responseHeadersAnswer(set)
	if st.ho.active() && !st.ho.sent && st.ho.held == nil {
		st.handoffServed(servedEP)
		st.ho.h.DecodeResponded()
		if hold := st.srv.opts.ResponseHeaderHold; hold > 0 && !h.GetEndOfStream() {
			// Until the first body chunk, at most hold: see eppHandoff.held.
			st.ho.held, st.ho.holdUntil = answer, time.Now().Add(hold)
			st.ho.rearm()
			return nil
		}
		st.ho.sent = true
		st.ho.wd.Headers()
		if h.GetEndOfStream() {
			st.ho.stop() // no body: the response is complete
		}
	}
	if h.GetEndOfStream() {
		// The response is complete: release what the request holds before the client can see
		// the answer (a client that reads the pool's counters right after must find them free).
		st.finish(nil)
	}
	if err := st.send(answer); err != nil {
		return err
	}
	st.respSent = true
	return nil
}

// onResponseBody passes each chunk through at once: a streamed token must never wait for the next.
func (st *stream) onResponseBody(b *extprocv3.HttpBody) error {
	eos := b.GetEndOfStream()
	st.transferChunk(b.GetBody())
	if stop, err := st.strictTransfer(eos); stop {
		return err
	}
	if eos {
		if res, ok := st.judgeTransfer(); ok && st.srv.opts.TransferHeader && st.ho.held != nil {
			st.transferHeader(st.ho.held, res)
		}
	}
	if st.ho.active() {
		if err := st.flushHeld(); err != nil {
			return err
		}
	}
	if st.ho.active() {
		if st.ho.status >= 200 && st.ho.status < 300 && len(b.GetBody()) > 0 {
			// The decode leg's first token: it took the prefill pod's KV (nothing to release).
			st.ho.h.DecodeFirstToken()
		}
		st.ho.wd.Chunk(time.Now(), eos)
		st.ho.rearm()
	}
	if st.lifecycle != nil && !st.finished {
		st.lifecycle.ResponseBody(len(b.GetBody()), eos)
	}
	if st.ownRoute {
		st.route.Chunk(len(b.GetBody()))
	}
	st.resp.chunk(b.GetBody())
	if eos {
		// The last chunk: release what the request holds before the client can see it.
		st.finish(nil)
	}
	return st.send(streamedBody(true, b.GetBody(), eos))
}

// finish ends the decision's lifecycle, exactly once whatever path the stream takes.
func (st *stream) finish(err error) {
	if st.finished {
		return
	}
	st.finished = true
	if err == nil && st.ho.active() {
		st.ho.h.Completed() // an async prefill leg may still report its (certain) success
	}
	st.endRoute(err)
	if st.lifecycle != nil {
		st.lifecycle.Done(err)
	}
	st.leaveRetry()
}

// joinHeaders maps lower-cased header names to their values, joining repeated names with ","
// in the order received. Repeats are collected first and joined once: concatenating as they
// arrive would copy the growing value on every repeat (quadratic in a hostile message).
func joinHeaders(hs []*corev3.HeaderValue) map[string]string {
	out := make(map[string]string, len(hs))
	var repeated map[string][]string
	for _, hv := range hs {
		key := strings.ToLower(hv.GetKey())
		val := hv.GetValue()
		if len(hv.GetRawValue()) > 0 {
			val = string(hv.GetRawValue())
		}
		prev, seen := out[key]
		if !seen {
			out[key] = val
			continue
		}
		if repeated == nil {
			repeated = map[string][]string{}
		}
		if repeated[key] == nil {
			repeated[key] = []string{prev}
		}
		repeated[key] = append(repeated[key], val)
	}
	for key, vals := range repeated {
		out[key] = strings.Join(vals, ",")
	}
	return out
}
