package extproc

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/apierror"
)

// openPartial opens a stream and sends the headers of a chat request and a first body chunk
// without end_of_stream: a request whose body is still arriving.
func openPartial(t *testing.T, c *envoy.Client, ctx context.Context, chunk []byte) *envoy.Stream {
	t.Helper()
	s, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SendRequestHeaders(envoy.Headers(":method", "POST", ":path", "/v1/chat/completions"), false, nil); err != nil {
		t.Fatal(err)
	}
	if chunk != nil {
		if err := s.SendRequestBody(chunk, false); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// watchBuffered returns a wait for the server's buffered body bytes to satisfy cond, woken by
// each change of them (admission.testHookBytes) and failing after 10 s. Call it before the
// server runs.
func watchBuffered(t *testing.T, srv *Server) func(what string, cond func(int64) bool) {
	changed := make(chan struct{}, 1)
	srv.adm.testHookBytes = changed
	return func(what string, cond func(int64) bool) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for !cond(srv.BufferedBodyBytes()) {
			select {
			case <-changed:
			case <-timeout:
				t.Fatalf("not within 10s: %s (%d bytes held)", what, srv.BufferedBodyBytes())
			}
		}
	}
}

// refusedWith reads the stream's next answer and checks it is an ImmediateResponse with the
// status, Retry-After and reason given, followed by the end of the stream.
func refusedWith(t *testing.T, s *envoy.Stream, status int, retryAfter, reason string) {
	t.Helper()
	msg, err := s.Recv()
	if err != nil {
		t.Fatalf("waiting for the refusal: %v", err)
	}
	ir := msg.GetImmediateResponse()
	if ir == nil || int(ir.GetStatus().GetCode()) != status || ir.GetDetails() != "tandem_"+reason {
		t.Fatalf("got %v, want a %d ImmediateResponse (%s)", msg, status, reason)
	}
	hs := map[string]string{}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		hs[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	if hs["retry-after"] != retryAfter || hs[apierror.HeaderRouting] != "true" {
		t.Errorf("headers %v, want retry-after %q and %s: true", hs, retryAfter, apierror.HeaderRouting)
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Errorf("after the refusal: %v, want the stream to end (nothing more is read or held)", err)
	}
}

// TestStreamsOverTheLimitAreAnswered429AtOnce: past Limits.MaxStreams open streams, the next
// request is answered 429 with Retry-After as soon as its headers arrive; once a stream ends, a
// new one is admitted again.
func TestStreamsOverTheLimitAreAnswered429AtOnce(t *testing.T) {
	obs := newRecObserver()
	srv := NewServer(twoPods(), nil, Options{Observer: obs, Limits: Limits{MaxStreams: 2}})
	c, admitted := serveAdmitted(t, srv)
	ctx := testCtx(t)
	aCtx, cancelA := context.WithCancel(ctx)
	openPartial(t, c, aCtx, []byte(`{"model":`))
	openPartial(t, c, ctx, []byte(`{"model":`))
	admitted.wait(t, 2) // both streams hold a slot
	start := time.Now()
	refusedWith(t, openPartial(t, c, ctx, nil), http.StatusTooManyRequests, "1", apierror.ReasonTooManyStreams)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the 429 took %v: it must not wait for a slot", took)
	}
	cancelA()
	obs.waitClosed(t, 2) // the refused stream, then stream A
	_, r, err := c.Route(ctx, envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)})
	if err != nil || r.Immediate != nil {
		t.Fatalf("after a stream ended: %v %+v, want it routed", err, r)
	}
}

// TestBodyBudgetRefusesWhatDoesNotFit: the bodies all streams hold while they arrive share
// Limits.MaxBufferedBodyBytes. A chunk that does not fit is answered 503 with Retry-After and its
// stream's body dropped; a body arriving whole in one message always gets in; every byte is
// returned when the streams end.
func TestBodyBudgetRefusesWhatDoesNotFit(t *testing.T) {
	obs := newRecObserver()
	srv := NewServer(twoPods(), nil, Options{Observer: obs, Limits: Limits{MaxBufferedBodyBytes: 1000}})
	buffered := watchBuffered(t, srv)
	c := serve(t, srv)
	ctx := testCtx(t)
	pad := func(n int) []byte { return bytes.Repeat([]byte(" "), n) }

	a := openPartial(t, c, ctx, append([]byte(`{"model":"m",`), pad(600)...))
	buffered("stream A's first chunk held", func(n int64) bool { return n >= 600 })
	b := openPartial(t, c, ctx, pad(300)) // fits: 913 of 1000
	buffered("stream B's first chunk held too", func(n int64) bool { return n >= 900 })
	if err := b.SendRequestBody(pad(300), false); err != nil { // does not fit
		t.Fatal(err)
	}
	refusedWith(t, b, http.StatusServiceUnavailable, "1", apierror.ReasonBodyBudget)
	obs.waitClosed(t, 1)
	if got := srv.BufferedBodyBytes(); got != 613 {
		t.Errorf("%d bytes held after the refusal, want only stream A's 613", got)
	}

	// A whole body in one message is parsed and forwarded at once: never refused.
	whole := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: append([]byte(chatBody), pad(800)...)}
	_, r, err := c.Route(ctx, whole)
	if err != nil || r.Immediate != nil {
		t.Fatalf("a whole body while the budget is full: %v %+v, want it routed", err, r)
	}
	// Its share is returned just after its answer went out: wait for it, or stream A's last
	// chunk below could be refused for want of the whole body's bytes.
	buffered("only stream A's 613 bytes held after the whole body was answered", func(n int64) bool { return n == 613 })

	rest := []byte(`"messages":[{"role":"user","content":"hi"}]}`)
	if err := a.SendRequestBody(rest, true); err != nil {
		t.Fatal(err)
	}
	routed, err := a.ReadRoute(envoy.Request{Method: "POST"})
	if err != nil || routed.Immediate != nil || !bytes.HasSuffix(routed.Body, rest) {
		t.Fatalf("stream A: %v %+v", err, routed)
	}
	if got := srv.BufferedBodyBytes(); got != 0 {
		t.Errorf("%d bytes still held once every body was forwarded", got)
	}
}

// TestSlowBodyIsAnswered408: a body still arriving Limits.RequestBodyTimeout after its
// headers is answered 408 and its stream ended; a body in time is unaffected.
func TestSlowBodyIsAnswered408(t *testing.T) {
	obs := newRecObserver()
	srv := NewServer(twoPods(), nil, Options{Observer: obs, Limits: Limits{RequestBodyTimeout: 100 * time.Millisecond}})
	c := serve(t, srv)
	ctx := testCtx(t)
	s := openPartial(t, c, ctx, []byte(`{"model":"m",`))
	refusedWith(t, s, http.StatusRequestTimeout, "", apierror.ReasonBodyTimeout)
	obs.waitClosed(t, 1)
	if got := srv.BufferedBodyBytes(); got != 0 {
		t.Errorf("%d bytes held after the timeout", got)
	}
	_, r, err := c.Route(ctx, envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody), ChunkSize: 8})
	if err != nil || r.Immediate != nil {
		t.Fatalf("a body in time: %v %+v", err, r)
	}
}
