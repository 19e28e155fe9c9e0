package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func subsetHint(f func(*http.Request) []string, r *http.Request) *corev3.Metadata {
	if f == nil {
		return nil
	}
	list := f(r)
	if list == nil {
		return nil
	}
	return subsetMetadata(list)
}

func (x *exchange) send(m *extprocv3.ProcessingRequest) error {
	x.sendMu.Lock()
	defer x.sendMu.Unlock()
	return x.stream.Send(m)
}

func (x *exchange) receive() {
	defer close(x.msgs)
	for {
		m, err := x.stream.Recv()
		if err != nil {
			x.recvErr = err
			return
		}
		select {
		case x.msgs <- m:
		case <-x.streamCtx.Done():
			x.recvErr = x.streamCtx.Err()
			return
		}
	}
}

// relayBody streams one body to the EPP chunk by chunk, as read (no read-ahead, so SSE events
// are not held back). end_of_stream rides on the chunk that completes a declared length,
// otherwise on an empty final chunk; a body followed by trailers ends with a trailers message
// instead. keep sees every chunk; atEnd gets the trailers (those with a value) before the
// final message goes out and says whether they will be sent. Reading goes on after the EPP
// stream breaks, so the caller still gets the whole body.
func (x *exchange) relayBody(request bool, src io.Reader, length int64, trailer http.Header, toEPP bool,
	keep func([]byte), atEnd func(t http.Header, sent bool)) error {
	declared := len(trailer) > 0
	var total int64
	eosSent := false
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if err == io.EOF && request {
			x.clientBodyRead()
		}
		if n > 0 {
			chunk := bytes.Clone(buf[:n])
			if keep != nil {
				keep(chunk)
			}
			total += int64(n)
			last := !declared && length > 0 && total >= length
			if toEPP && x.send(bodyMsg(request, chunk, last)) != nil {
				toEPP = false
			}
			eosSent = eosSent || last
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	t := withValues(trailer)
	viaTrailers := toEPP && !eosSent && len(t) > 0
	atEnd(t, viaTrailers)
	switch {
	case !toEPP || eosSent:
	case viaTrailers:
		_ = x.send(trailersMsg(request, t))
	default:
		_ = x.send(bodyMsg(request, nil, true))
	}
	return nil
}

// readBody relays the client body to the EPP, keeping it whole for fail-open.
func (x *exchange) readBody(toEPP bool) {
	b := x.body
	defer close(b.done)
	err := x.relayBody(true, x.r.Body, x.r.ContentLength, x.r.Trailer, toEPP,
		func(chunk []byte) { b.data = append(b.data, chunk...) },
		func(t http.Header, sent bool) {
			x.mu.Lock()
			x.reqTrailers = t
			x.mu.Unlock()
			b.trailersSent.Store(sent)
		})
	if err != nil {
		b.err = err
		x.cancel()
	}
}

// pumpResponse relays the upstream body to the EPP and reports how it ended.
func (x *exchange) pumpResponse(resp *http.Response, done chan<- pumpResult) {
	var res pumpResult
	defer func() { done <- res }()
	defer resp.Body.Close()
	res.err = x.relayBody(false, resp.Body, resp.ContentLength, resp.Trailer, true, nil,
		func(t http.Header, sent bool) {
			x.mu.Lock()
			x.respTrailers = t
			x.mu.Unlock()
			res.trailersSent = sent
		})
}

// writeHeader sends the (mutated) upstream status and headers to the client.
func (x *exchange) writeHeader(h fields) bool {
	code := 0
	if s, ok := h.get(":status"); ok {
		code, _ = strconv.Atoi(s)
	}
	if code < 100 || code > 599 {
		x.fail(http.StatusBadGateway, "response :status is not an HTTP status after the EPP's mutation")
		return false
	}
	for k, vs := range h.httpHeader() {
		x.w.Header()[k] = vs
	}
	x.keepAliveUnlessUploading()
	x.w.WriteHeader(code)
	_ = http.NewResponseController(x.w).Flush()
	x.wroteHeader, x.status = true, code
	return true
}

// writeImmediate answers the client with the EPP's ImmediateResponse: its status (200 when
// absent or invalid, as Envoy does), text/plain unless its headers say otherwise, its body.
func (x *exchange) writeImmediate(ir *extprocv3.ImmediateResponse) {
	code := int(ir.GetStatus().GetCode())
	if code < 200 || code > 599 {
		code = http.StatusOK
	}
	h := fields{{"content-type", "text/plain"}}
	h.mutate(ir.GetHeaders())
	h.set("content-length", strconv.Itoa(len(ir.GetBody())))
	for k, vs := range h.httpHeader() {
		x.w.Header()[k] = vs
	}
	x.keepAliveUnlessUploading()
	x.w.WriteHeader(code)
	_, _ = x.w.Write(ir.GetBody())
	x.wroteHeader, x.status = true, code
	x.log.V(1).Info("immediate response from the EPP", "status", code, "details", ir.GetDetails())
}

// fail answers a gateway-local error, or asks for the stream to be cut if the response has
// started. The reason goes in the body and the x-gateway-error header.
func (x *exchange) fail(code int, reason string) bool {
	x.log.Info("request failed", "status", code, "reason", reason)
	if x.wroteHeader {
		return true
	}
	x.w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	x.w.Header().Set("X-Gateway-Error", reason)
	x.keepAliveUnlessUploading()
	x.w.WriteHeader(code)
	_, _ = io.WriteString(x.w, reason+"\n")
	x.wroteHeader, x.status = true, code
	return false
}

// localReply answers a request the gateway routed but could not get a response for (no
// endpoint accepted a connection, the upstream reset before its headers, the upstream timeout)
// as Envoy does: the local reply's headers pass through the EPP's response phase first, so the
// EPP learns what happened to the request it routed (and may add its headers), then the client
// gets the reply. Without an answer from the EPP in time the client gets the reply as it is.
func (x *exchange) localReply(code int, reason string) bool {
	if x.wroteHeader {
		return x.fail(code, reason) // the response started: cut
	}
	x.log.Info("request failed", "status", code, "reason", reason)
	h := fields{{":status", strconv.Itoa(code)}, {"content-type", "text/plain; charset=utf-8"}, {"x-gateway-error", reason}}
	if err := x.send(headersMsg(false, h, true, nil)); err != nil {
		return x.fail(code, reason)
	}
	timer := time.NewTimer(x.g.opts.DecisionTimeout)
	defer timer.Stop()
	for answered := false; !answered; {
		select {
		case m, ok := <-x.msgs:
			if !ok {
				return x.fail(code, reason)
			}
			switch v := m.GetResponse().(type) {
			case *extprocv3.ProcessingResponse_ResponseHeaders:
				h.mutate(v.ResponseHeaders.GetResponse().GetHeaderMutation())
				answered = true
			case *extprocv3.ProcessingResponse_ImmediateResponse:
				x.writeImmediate(v.ImmediateResponse)
				return x.complete()
			}
			// anything else (a late request-body answer) is not the answer awaited
		case <-timer.C:
			return x.fail(code, reason)
		case <-x.ctx.Done():
			return false
		}
	}
	h.set(":status", strconv.Itoa(code)) // a local reply's status is the gateway's
	h.set("content-length", strconv.Itoa(len(reason)+1))
	if !x.writeHeader(h) {
		return false
	}
	_, _ = io.WriteString(x.w, reason+"\n")
	return x.complete()
}

// beforeDecision handles an EPP that is unreachable or failed before deciding: fail open to
// the default endpoints, or fail closed with 503 (unreachable) / 500 (anything else).
func (x *exchange) beforeDecision(err error) bool {
	if x.r.Context().Err() != nil {
		return false // the client left; nobody to answer
	}
	if x.g.opts.FailOpen {
		x.log.Info("EPP failed before deciding; failing open", "err", err)
		return x.failOpen()
	}
	code := http.StatusInternalServerError
	if status.Code(err) == codes.Unavailable {
		code = http.StatusServiceUnavailable
	}
	return x.fail(code, "EPP failed before deciding (fail-closed): "+err.Error())
}

// failOpen proxies the original request, untouched, to the default endpoints in order.
func (x *exchange) failOpen() bool {
	select {
	case <-x.body.done:
	case <-x.ctx.Done():
		return false
	}
	if x.body.err != nil {
		return false
	}
	ub := newReplayBody()
	ub.append(x.body.data)
	x.mu.Lock()
	ub.finish(x.reqTrailers)
	x.mu.Unlock()
	defaults := x.g.opts.DefaultEndpoints
	for i, ep := range defaults {
		resp, connectFailed, err := x.roundTrip(x.ctx, ep, ub, x.reqHeaders)
		if err != nil {
			if connectFailed && i+1 < len(defaults) {
				continue
			}
			if connectFailed {
				return x.fail(http.StatusServiceUnavailable, fmt.Sprintf("fail-open: none of the default endpoints %v accepted a connection", defaults))
			}
			return x.fail(http.StatusBadGateway, fmt.Sprintf("fail-open: upstream %s: %v", ep, err))
		}
		x.served = ep
		return x.copyResponse(resp)
	}
	return false
}

// copyResponse relays an upstream response as is, flushing every read.
func (x *exchange) copyResponse(resp *http.Response) bool {
	defer resp.Body.Close()
	if !x.writeHeader(responseFields(resp)) {
		return false
	}
	buf := make([]byte, chunkSize)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := x.w.Write(buf[:n]); werr != nil {
				return false
			}
			_ = http.NewResponseController(x.w).Flush()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return true
		}
	}
	for k, vs := range withValues(resp.Trailer) {
		for _, v := range vs {
			x.w.Header().Add(http.TrailerPrefix+k, v)
		}
	}
	return false
}

// complete half-closes the ext_proc stream once the client has the whole response. The EPP
// gets up to two seconds to end its side (it releases per-request state then) while the
// handler returns, so the client is not kept waiting. In EndEnvoy mode the stream is reset
// right after the half-close, as Envoy closes it once the last response message is answered.
func (x *exchange) complete() bool {
	x.sendMu.Lock()
	_ = x.stream.CloseSend()
	x.sendMu.Unlock()
	if !x.unlink() {
		return false // already cancelled
	}
	if x.g.opts.StreamEnd == EndEnvoy {
		x.streamCancel()
		return false
	}
	go func() {
		defer x.streamCancel()
		t := time.NewTimer(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case _, ok := <-x.msgs:
				if !ok {
					return
				}
			case <-t.C:
				return
			}
		}
	}()
	return false
}

// cleanup stops everything the exchange started. A client still sending its body is cut off
// by a read deadline so the body reader ends before the handler returns. Only then: once the
// body has been read to its end, net/http reads the connection in the background for the
// next request, and a deadline that fires there cancels the context of every later request
// on that connection (each would look like a client that left). A reader past the end is
// only relaying to the EPP, which the cancelled stream unblocks.
func (x *exchange) cleanup() {
	x.cancel()
	select {
	case <-x.body.done:
	default:
		if !x.body.read.Load() {
			_ = http.NewResponseController(x.w).SetReadDeadline(time.Now())
		}
		<-x.body.done
	}
}

// testHookBodyRead, when set by a test, runs in the body reader once the client's body has
// been read to its end, before its last chunk goes to the EPP.
var testHookBodyRead func(ctx context.Context)

// clientBodyRead records that the client's body has been read to its end.
func (x *exchange) clientBodyRead() {
	x.body.read.Store(true)
	if testHookBodyRead != nil {
		testHookBodyRead(x.ctx)
	}
}

// keepAliveUnlessUploading marks a response that starts while the client is still sending its
// body as the last on its HTTP/1 connection (as Envoy does): the rest of the body may be cut
// off by a read deadline (cleanup), which spoils the connection for another request.
func (x *exchange) keepAliveUnlessUploading() {
	if x.hasBody && !x.body.read.Load() && x.r.ProtoMajor == 1 {
		x.w.Header().Set("Connection", "close")
	}
}
