package extproc

import (
	"context"
	"encoding/json"
	"maps"
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
	body       []byte
	reqEnded   bool // the whole request has been received
	answered   bool // the route or an ImmediateResponse has been sent
	rejected   bool // an ImmediateResponse was sent; the rest of the request is drained unanswered

	decision    *picker.Decision
	lifecycle   picker.Lifecycle
	respHeaders bool // response headers seen (Lifecycle.ResponseHeaders is called at most once)
	finished    bool

	ho eppHandoff // the "epp" hand-off, when the decision has one
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
		return false, st.onResponseBody(m.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
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
	case key == wire.HeaderPrefillerHostPort:
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
	return false, nil
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
	}
	if st.rejected { // draining after a 413
		return st.reqEnded, nil
	}
	if limit := st.srv.opts.MaxBodyBytes; len(st.body)+len(b.GetBody()) > limit {
		st.body = nil
		return st.reject(apierror.TooLarge(limit))
	}
	if st.body == nil {
		// Most bodies arrive in one chunk: keep the received bytes (the message is not reused)
		// rather than copying them.
		// The full slice expression makes a later append copy instead of writing past it.
		st.body = b.GetBody()[:len(b.GetBody()):len(b.GetBody())]
	} else {
		st.body = append(st.body, b.GetBody()...)
	}
	if st.reqEnded {
		return st.decide(true, true)
	}
	return false, nil
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

// candidates is the part of the pool this request may reach.
func (st *stream) candidates(snap *pool.Snapshot) ([]*pool.Endpoint, *apierror.Error) {
	if len(snap.Endpoints) == 0 {
		return nil, apierror.Unavailable("no_endpoint",
			"the inference pool has no ready endpoints; check the pool's selector and that its pods are Ready")
	}
	sel, what := st.subset, "the gateway's subset hint ("+wire.MetadataNamespaceSubset+"/"+wire.MetadataKeySubset+")"
	if st.testSel.present {
		sel, what = st.testSel, "the "+wire.HeaderTestSelection+" header"
	}
	cands := sel.filter(snap)
	if len(cands) == 0 {
		return nil, apierror.Unavailable("subset_empty",
			"no endpoint of the inference pool is in %s: %q", what, strings.Join(sel.entries, ","))
	}
	return cands, nil
}

// decide parses and schedules the complete request, then sends the route and the body.
// hasBody says body chunks are expected back; bodyEOS whether the last carries end_of_stream
// (false when trailers follow).
func (st *stream) decide(hasBody, bodyEOS bool) (bool, error) {
	start := time.Now()
	if hasBody {
		st.srv.obs.RequestBody(len(st.body))
	}
	req, err := request.Parse(st.method, st.path, st.headers, st.body)
	if err != nil {
		return st.reject(apierror.From(err))
	}
	snap := st.srv.store.Load()
	cands, aerr := st.candidates(snap)
	if aerr != nil {
		return st.reject(aerr)
	}
	d, err := st.srv.sched.Schedule(st.ctx, req, snap, cands)
	if err == nil && (d == nil || len(d.Destination) == 0) {
		if d != nil && d.Lifecycle != nil {
			d.Lifecycle.Done(ErrStreamEnded)
		}
		err = apierror.Unavailable("no_endpoint", "the scheduler chose no endpoint among %d candidates", len(cands))
	}
	if err != nil {
		return st.reject(apierror.From(err))
	}
	st.decision, st.lifecycle = d, d.Lifecycle

	hostPorts := make([]string, len(d.Destination))
	for i, e := range d.Destination {
		hostPorts[i] = e.HostPort()
	}
	destination := strings.Join(hostPorts, ",")
	set := []*corev3.HeaderValueOption{headerOption(wire.HeaderDestination, destination)}
	setKeys := map[string]bool{wire.HeaderDestination: true}
	mode := handoffMode(d, hasBody)
	var prefillTarget string // sidecar hand-off: also in the envoy.lb metadata
	if mode == config.HandoffSidecar {
		prefillTarget = d.Prefill[0].HostPort()
		if _, ok := d.SetHeaders[wire.HeaderPrefillerHostPort]; !ok {
			set = append(set, headerOption(wire.HeaderPrefillerHostPort, prefillTarget))
			setKeys[wire.HeaderPrefillerHostPort] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(d.SetHeaders)) {
		lk := strings.ToLower(k)
		if setKeys[lk] {
			continue // the destination is the protocol's, not a strategy's, to set
		}
		if mode == config.HandoffEPP && lk == wire.HeaderPrefillerHostPort {
			continue // Tandem runs the prefill leg: the decode pod must not prefill again
		}
		setKeys[lk] = true
		set = append(set, headerOption(lk, d.SetHeaders[k]))
	}
	body := st.body
	if d.Body != nil {
		if hasBody {
			body = d.Body
		} else {
			st.log.V(1).Info("ignoring a body mutation for a request without a body", "strategy", d.Strategy)
		}
	}
	decided := time.Since(start)
	if mode == config.HandoffEPP {
		st.body = body
		st.srv.obs.Decided(DecisionEvent{Strategy: d.Strategy, Outcome: d.Outcome, Step: d.Step,
			Latency: decided, Candidates: len(cands)})
		decodeBody, aerr := st.startHandoff(req, d, cands)
		if aerr != nil {
			st.body = nil
			return st.failRouted(aerr)
		}
		body = decodeBody
	}
	if hasBody && (d.Body != nil || mode == config.HandoffEPP) {
		set = append(set, headerOption(wire.HeaderContentLength, strconv.Itoa(len(body))))
		setKeys[wire.HeaderContentLength] = true
	}
	if st.srv.opts.ConformanceMode {
		set = append(set, headerOption(wire.HeaderEchoSetHeader, wire.HeaderTestServed+":"+hostPorts[0]))
	}
	var remove []string
	for _, k := range st.strip {
		if !setKeys[k] {
			remove = append(remove, k)
		}
	}

	if mode != config.HandoffEPP {
		st.srv.obs.Decided(DecisionEvent{Strategy: d.Strategy, Outcome: d.Outcome, Step: d.Step,
			Latency: decided, Candidates: len(cands)})
	}
	if l := st.log.V(1); l.Enabled() { // the hot path: build no log arguments unless asked
		l.Info("routed", "destination", destination, "strategy", d.Strategy, "step", d.Step,
			"api", req.API, "model", req.Model, "bodyBytes", len(st.body))
	}

	st.answered = true
	st.body = nil
	if st.ho.active() {
		st.ho.rearm() // sync engines: the prefill leg already succeeded, the watchdog is armed
	}
	if err := st.send(routeAnswer(destination, prefillTarget, set, remove)); err != nil {
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
	var set []*corev3.HeaderValueOption
	if d := st.decision; d != nil {
		if st.lifecycle != nil && !st.respHeaders && !st.finished {
			st.lifecycle.ResponseHeaders(code, served)
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
	if err := st.send(answer); err != nil {
		return err
	}
	if h.GetEndOfStream() {
		st.finish(nil)
	}
	return nil
}

// onResponseBody passes each chunk through at once: a streamed token must never wait for the next.
func (st *stream) onResponseBody(b *extprocv3.HttpBody) error {
	if st.ho.active() {
		if err := st.flushHeld(); err != nil {
			return err
		}
	}
	if err := st.send(streamedBody(true, b.GetBody(), b.GetEndOfStream())); err != nil {
		return err
	}
	if st.ho.active() {
		st.ho.wd.Chunk(time.Now(), b.GetEndOfStream())
		st.ho.rearm()
	}
	if st.lifecycle != nil && !st.finished {
		st.lifecycle.ResponseBody(len(b.GetBody()), b.GetEndOfStream())
	}
	if b.GetEndOfStream() {
		st.finish(nil)
	}
	return nil
}

// finish ends the decision's lifecycle, exactly once whatever path the stream takes.
func (st *stream) finish(err error) {
	if st.finished {
		return
	}
	st.finished = true
	if st.lifecycle != nil {
		st.lifecycle.Done(err)
	}
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
