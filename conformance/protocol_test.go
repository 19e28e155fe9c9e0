package conformance_test

// The protocol suite: Tandem's ext_proc server behind its real gRPC listener (TLS, as in
// production) on 127.0.0.1, driven by conformance/envoy exactly as Envoy's ext_proc filter
// drives an EPP in the processing mode Gateway API Inference Extension gateways use. One
// test per rule of the Endpoint Picker Protocol (GIE v1.6.0) and of issue 2.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/serving"
)

// protoPool: pods a and b serve one port each; pod c is data-parallel with ranks on 8000 and 8002.
func protoPool() []*pool.Endpoint {
	return []*pool.Endpoint{
		pool.NewEndpoint("app", "a", "10.0.0.1", 8000, 0, nil, nil),
		pool.NewEndpoint("app", "b", "10.0.0.2", 8000, 0, nil, nil),
		pool.NewEndpoint("app", "c", "10.0.0.3", 8000, 0, nil, nil),
		pool.NewEndpoint("app", "c", "10.0.0.3", 8002, 1, nil, nil),
	}
}

var protoPoolHostPorts = []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.3:8002"}

const (
	protoChat       = `{"model":"m","messages":[{"role":"user","content":"Say hello."}]}`
	protoCompletion = `{"model":"m","prompt":"Say hello."}`
)

// protoTandem is one Tandem instance under test.
type protoTandem struct {
	store  *pool.Store
	server *serving.Server
	client *envoy.Client
}

// startProtoTandem serves Tandem (default scheduler) with TLS on free 127.0.0.1 ports;
// eps nil means an empty pool. It is stopped when the test ends.
func startProtoTandem(t *testing.T, opts extproc.Options, eps []*pool.Endpoint, synced bool) *protoTandem {
	t.Helper()
	store := pool.NewStore()
	if eps != nil || synced {
		store.Publish(pool.Info{Name: "pool", Namespace: "app"}, eps, synced)
	}
	opts.Logger = logr.Discard()
	srv, err := serving.New(serving.Config{Host: "127.0.0.1", SecureServing: true, GracePeriod: time.Second, Logger: logr.Discard()},
		extproc.NewServer(store, nil, opts), store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	client, err := envoy.Dial(srv.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Tandem stopped with %v", err)
		}
	})
	return &protoTandem{store: store, server: srv, client: client}
}

func protoCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func protoPost(path, body string) envoy.Request {
	return envoy.Request{Method: "POST", Path: path, Body: []byte(body)}
}

// route sends r and reads Tandem's answer.
func (p *protoTandem) route(t *testing.T, r envoy.Request) (*envoy.Stream, *envoy.Routed) {
	t.Helper()
	s, routed, err := p.client.Route(protoCtx(t), r)
	if err != nil {
		t.Fatalf("routing %s %s: %v", r.Method, r.Path, err)
	}
	return s, routed
}

// mustRoute checks the answer is a well-formed route: header and metadata agree, the route
// cache is cleared, every endpoint is in allowed and listed once, and the body came back whole.
func protoMustRoute(t *testing.T, r envoy.Request, routed *envoy.Routed, allowed []string) []string {
	t.Helper()
	if routed.Immediate != nil {
		t.Fatalf("got an immediate %d (%s), want a route", routed.Immediate.Status, routed.Immediate.Body)
	}
	eps := routed.Endpoints()
	if len(eps) == 0 {
		t.Fatal("no x-gateway-destination-endpoint header")
	}
	if routed.MetadataDestination != routed.Destination {
		t.Errorf("metadata envoy.lb/x-gateway-destination-endpoint %q differs from the header %q", routed.MetadataDestination, routed.Destination)
	}
	if !routed.ClearRouteCache {
		t.Error("clear_route_cache not set")
	}
	seen := map[string]bool{}
	for _, e := range eps {
		if !slices.Contains(allowed, e) {
			t.Errorf("endpoint %s is not among %v", e, allowed)
		}
		if seen[e] {
			t.Errorf("endpoint %s listed twice in %q", e, routed.Destination)
		}
		seen[e] = true
	}
	if len(routed.Headers.Appends) > 0 {
		t.Errorf("headers %v would be appended to client values instead of replacing them", routed.Headers.Appends)
	}
	if !r.NoBody {
		if !bytes.Equal(routed.Body, r.Body) {
			t.Errorf("request body came back as %d bytes %q, want the %d sent", len(routed.Body), protoTruncate(routed.Body), len(r.Body))
		}
		if routed.MaxChunk > 62000 {
			t.Errorf("a body chunk of %d bytes; at most 62000 allowed", routed.MaxChunk)
		}
	} else if routed.BodyChunks != 0 {
		t.Errorf("%d body chunks for a request without a body", routed.BodyChunks)
	}
	return eps
}

func protoTruncate(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "…"
	}
	return string(b)
}

// TestProtocolDeferredHeadersAnswer: the answer to the request headers waits for the whole
// body — it can only be right if it was decided on the complete body.
func TestProtocolDeferredHeadersAnswer(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	cases := []struct {
		name       string
		chunks     []string
		wantStatus int // 0: routed
	}{
		// The first chunk alone would pass for anything; the last decides.
		{"valid once complete", []string{`{"prompt":"x"`, `,"model":"m"}`}, 0},
		{"model missing once complete", []string{`{"prompt":"x"`, `,"model":""}`}, 400},
		{"not JSON once complete", []string{`{"prompt":"x","model":"m"}`, `trailing`}, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := p.client.Open(protoCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SendRequestHeaders(envoy.Headers(":method", "POST", ":path", "/v1/completions"), false, nil); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				routed *envoy.Routed
				err    error
			}
			first := make(chan answer, 1)
			go func() {
				routed, err := s.ReadRoute(envoy.Request{})
				first <- answer{routed, err}
			}()
			if err := s.SendRequestBody([]byte(tc.chunks[0]), false); err != nil {
				t.Fatal(err)
			}
			select {
			case a := <-first:
				t.Fatalf("answered (%+v, %v) before the body ended", a.routed, a.err)
			default:
			}
			if err := s.SendRequestBody([]byte(tc.chunks[1]), true); err != nil {
				t.Fatal(err)
			}
			a := <-first
			if a.err != nil {
				t.Fatal(a.err)
			}
			if tc.wantStatus == 0 {
				protoMustRoute(t, envoy.Request{Body: []byte(strings.Join(tc.chunks, ""))}, a.routed, protoPoolHostPorts)
			} else if a.routed.Immediate == nil || a.routed.Immediate.Status != tc.wantStatus {
				t.Errorf("got %+v, want an immediate %d", a.routed, tc.wantStatus)
			}
		})
	}
}

// TestProtocolChunkedBodies: bodies arrive in chunks of any size; Tandem answers once, with
// the body handed back whole in chunks of at most 62000 bytes, end_of_stream on the last.
func TestProtocolChunkedBodies(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	big := `{"model":"m","prompt":"` + strings.Repeat("token ", 50000) + `"}` // ~300 KB
	cases := []struct {
		name string
		req  envoy.Request
	}{
		{"one chunk", protoPost("/v1/chat/completions", protoChat)},
		{"1-byte chunks", envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(protoChat), ChunkSize: 1}},
		{"many chunks", envoy.Request{Method: "POST", Path: "/v1/completions", Body: []byte(big), ChunkSize: 16384}},
		{"large body in one chunk", protoPost("/v1/completions", big)},
		{"empty final chunk", envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(protoChat), ChunkSize: 7, EmptyFinalChunk: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, routed := p.route(t, tc.req)
			protoMustRoute(t, tc.req, routed, protoPoolHostPorts)
			if !routed.BodyEOS {
				t.Error("the last body chunk did not carry end_of_stream")
			}
			if want := (len(tc.req.Body) + 61999) / 62000; routed.BodyChunks != want {
				t.Errorf("%d body chunks for %d bytes, want %d", routed.BodyChunks, len(tc.req.Body), want)
			}
		})
	}
}

// TestProtocolGETWithoutBody: end_of_stream on the headers is answered at once, with no body.
func TestProtocolGETWithoutBody(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	for _, path := range []string{"/", "/primary", "/v1/models"} {
		req := envoy.Request{Method: "GET", Path: path, NoBody: true}
		_, routed := p.route(t, req)
		protoMustRoute(t, req, routed, protoPoolHostPorts)
	}
}

// TestProtocolFallbacksListed: the destination lists the primary then distinct fallbacks,
// identically in the header and the metadata.
func TestProtocolFallbacksListed(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	req := protoPost("/v1/chat/completions", protoChat)
	_, routed := p.route(t, req)
	if eps := protoMustRoute(t, req, routed, protoPoolHostPorts); len(eps) != 3 {
		t.Errorf("destination %q: want the primary and 2 fallbacks", routed.Destination)
	}
}

// TestProtocolSubsetHint: the gateway's subset hint restricts the pick, as a list or a string,
// entries with or without port; nothing eligible is a 503.
func TestProtocolSubsetHint(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	cases := []struct {
		name    string
		subset  any
		allowed []string // nil: 503
	}{
		{"list with ports", []string{"10.0.0.2:8000"}, []string{"10.0.0.2:8000"}},
		{"list without ports", []string{"10.0.0.1", "10.0.0.2"}, []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"string with ports", "10.0.0.3:8002", []string{"10.0.0.3:8002"}},
		{"string without ports, every rank", "10.0.0.3", []string{"10.0.0.3:8000", "10.0.0.3:8002"}},
		{"comma string, mixed", "10.0.0.1, 10.0.0.3:8000", []string{"10.0.0.1:8000", "10.0.0.3:8000"}},
		{"foreign entries ignored", []string{"192.168.7.7:8000", "10.0.0.2:8000"}, []string{"10.0.0.2:8000"}},
		{"nothing eligible", []string{"192.168.7.7:8000", "10.0.0.2:9999"}, nil},
		{"empty list", []string{}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := protoPost("/v1/chat/completions", protoChat)
			req.Subset = tc.subset
			_, routed := p.route(t, req)
			if tc.allowed == nil {
				protoExpectError(t, routed, 503, "")
				return
			}
			if eps := protoMustRoute(t, req, routed, tc.allowed); len(eps) != len(tc.allowed) {
				t.Errorf("destination %q: want all of %v listed", routed.Destination, tc.allowed)
			}
		})
	}
}

// expectError checks an ImmediateResponse: status, JSON content type, x-error-routing and an
// OpenAI-style error body naming param (when given).
func protoExpectError(t *testing.T, routed *envoy.Routed, status int, param string) {
	t.Helper()
	im := routed.Immediate
	if im == nil {
		t.Fatalf("routed to %q, want an immediate %d", routed.Destination, status)
	}
	if im.Status != status {
		t.Errorf("status %d (%s), want %d", im.Status, im.Body, status)
	}
	if im.Headers["content-type"] != "application/json" || im.Headers["x-error-routing"] != "true" {
		t.Errorf("headers %v: want content-type application/json and x-error-routing: true", im.Headers)
	}
	var body struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(im.Body, &body); err != nil {
		t.Fatalf("error body %q is not JSON: %v", im.Body, err)
	}
	if body.Error.Code != status || body.Error.Message == "" || body.Error.Type == "" {
		t.Errorf("error body %s: want code %d, a message and a type", im.Body, status)
	}
	if param != "" && (body.Error.Param == nil || *body.Error.Param != param) {
		t.Errorf("error body %s: want param %q", im.Body, param)
	}
}

// TestProtocolErrors: each request-level error is an ImmediateResponse, never a broken stream.
func TestProtocolErrors(t *testing.T) {
	full := startProtoTandem(t, extproc.Options{MaxBodyBytes: 1024}, protoPool(), true)
	empty := startProtoTandem(t, extproc.Options{}, nil, true)
	cases := []struct {
		name   string
		p      *protoTandem
		req    envoy.Request
		status int
		param  string
	}{
		{"400 body is not JSON", full, protoPost("/v1/chat/completions", `{"model": "m", "messages": [`), 400, ""},
		{"400 missing model", full, protoPost("/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`), 400, "model"},
		{"400 missing prompt", full, protoPost("/v1/completions", `{"model":"m"}`), 400, "prompt"},
		{"400 missing messages", full, protoPost("/v1/chat/completions", `{"model":"m"}`), 400, "messages"},
		{"413 above the body limit", full, envoy.Request{Method: "POST", Path: "/v1/completions",
			Body: []byte(`{"model":"m","prompt":"` + strings.Repeat("x", 2000) + `"}`), ChunkSize: 500}, 413, ""},
		{"503 empty pool", empty, protoPost("/v1/chat/completions", protoChat), 503, ""},
		{"503 empty pool, GET", empty, envoy.Request{Method: "GET", Path: "/", NoBody: true}, 503, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, routed := tc.p.route(t, tc.req)
			protoExpectError(t, routed, tc.status, tc.param)
			// The stream then ends cleanly: no further answer, no gRPC error.
			if msg, err := s.Recv(); err != io.EOF {
				t.Errorf("after the immediate response: %v, %v; want the stream to end", msg, err)
			}
		})
	}
}

// TestProtocolHeaderHygiene: control headers a client sends never reach a backend.
func TestProtocolHeaderHygiene(t *testing.T) {
	client := envoy.Headers(
		"x-gateway-destination-endpoint", "169.254.169.254:80",
		"x-gateway-destination-endpoint-fallback", "169.254.169.254:80",
		"x-gateway-destination-endpoint-served", "10.0.0.1:8000",
		"x-gateway-destination-endpoint-subset", "10.0.0.1",
		"x-prefiller-host-port", "169.254.169.254:80",
		"test-epp-endpoint-selection", "10.0.0.1",
		"x-request-id", "keep-me")
	cases := []struct {
		conformance bool
		remove      []string
	}{
		{false, []string{"test-epp-endpoint-selection", "x-gateway-destination-endpoint-fallback",
			"x-gateway-destination-endpoint-served", "x-gateway-destination-endpoint-subset", "x-prefiller-host-port"}},
		// The conformance suite's own header stays in conformance mode; the rest still goes.
		{true, []string{"x-gateway-destination-endpoint-fallback",
			"x-gateway-destination-endpoint-served", "x-gateway-destination-endpoint-subset", "x-prefiller-host-port"}},
	}
	for _, tc := range cases {
		p := startProtoTandem(t, extproc.Options{ConformanceMode: tc.conformance}, protoPool(), true)
		req := protoPost("/v1/chat/completions", protoChat)
		req.Headers = client
		_, routed := p.route(t, req)
		protoMustRoute(t, req, routed, protoPoolHostPorts)
		got := slices.Sorted(slices.Values(routed.Headers.Remove))
		if !slices.Equal(got, tc.remove) {
			t.Errorf("conformance=%v: removed %v, want %v", tc.conformance, got, tc.remove)
		}
		// x-gateway-destination-endpoint is replaced, not removed: it carries Tandem's pick.
		if routed.Destination == "169.254.169.254:80" {
			t.Errorf("conformance=%v: the client's destination survived", tc.conformance)
		}
		if slices.Contains(routed.Headers.Remove, "x-request-id") {
			t.Error("an ordinary header was removed")
		}
	}
}

// TestProtocolHalfClose: a client that half-closes after the body still gets the whole answer.
func TestProtocolHalfClose(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	for _, req := range []envoy.Request{
		{Method: "POST", Path: "/v1/chat/completions", Body: []byte(protoChat), ChunkSize: 10, HalfClose: true},
		{Method: "GET", Path: "/", NoBody: true, HalfClose: true},
	} {
		s, routed := p.route(t, req)
		protoMustRoute(t, req, routed, protoPoolHostPorts)
		if msg, err := s.Recv(); err != io.EOF {
			t.Errorf("after the answer: %v, %v; want the stream to end", msg, err)
		}
	}
}

// TestProtocolMissingPath: without :path (NGINX Gateway Fabric's shim sends none), chat and
// completions are told apart by the body, and a body that is neither is a 400 (issue 13).
func TestProtocolMissingPath(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	cases := []struct {
		name   string
		body   string
		status int // 0: routed
	}{
		{"chat body", protoChat, 0},
		{"completions body", protoCompletion, 0},
		{"embeddings body", `{"model":"m","input":"x"}`, 400},
		{"chat body without model", `{"messages":[{"role":"user","content":"x"}]}`, 400},
		{"not JSON", `model=m`, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := envoy.Request{Method: "POST", Body: []byte(tc.body)}
			_, routed := p.route(t, req)
			if tc.status == 0 {
				protoMustRoute(t, req, routed, protoPoolHostPorts)
			} else {
				protoExpectError(t, routed, tc.status, "")
			}
		})
	}
}

// TestProtocolHeaderValueFields: header values are read from raw_value (Envoy) or value (others).
func TestProtocolHeaderValueFields(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	for _, valueField := range []bool{false, true} {
		// A prompt sent to the chat path is a 400 naming "messages" only if :path was read.
		s, err := p.client.Open(protoCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		s.ValueField = valueField
		req := protoPost("/v1/chat/completions", protoCompletion)
		if err := s.SendRequest(req); err != nil {
			t.Fatal(err)
		}
		routed, err := s.ReadRoute(req)
		if err != nil {
			t.Fatal(err)
		}
		protoExpectError(t, routed, 400, "messages")
	}
}

// TestProtocolOtherAPIs: requests that are not completions are routed, never refused.
func TestProtocolOtherAPIs(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	for _, req := range []envoy.Request{
		protoPost("/v1/embeddings", `{"model":"m","input":"hello"}`),
		protoPost("/v1/rerank", `not json at all`),
		protoPost("/tokenize", ``),
		{Method: "GET", Path: "/v1/models", NoBody: true},
	} {
		_, routed := p.route(t, req)
		protoMustRoute(t, req, routed, protoPoolHostPorts)
	}
}

// TestProtocolTrailers: a request ending with trailers is answered (body without
// end_of_stream, then the trailers); response trailers are answered too.
func TestProtocolTrailers(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	req := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(protoChat), Trailers: true}
	s, routed := p.route(t, req)
	protoMustRoute(t, req, routed, protoPoolHostPorts)
	if !routed.TrailersAnswered || routed.BodyEOS {
		t.Errorf("trailers answered %v, body end_of_stream %v; want true, false", routed.TrailersAnswered, routed.BodyEOS)
	}
	if _, err := s.Respond(envoy.Response{Status: 200, Chunks: [][]byte{[]byte("x")}, Trailers: true}); err != nil {
		t.Fatal(err)
	}
}

// TestProtocolServedEndpoint: in conformance mode the gateway's served endpoint comes back in
// x-conformance-test-served-endpoint; outside it, that header is never added.
func TestProtocolServedEndpoint(t *testing.T) {
	cases := []struct {
		conformance bool
		served      string
		want        string // "" = header absent
	}{
		{true, "10.0.0.2:8000", "10.0.0.2:8000"},
		{true, "", "fail: missing envoy lb metadata"},
		{false, "10.0.0.2:8000", ""},
	}
	for _, tc := range cases {
		p := startProtoTandem(t, extproc.Options{ConformanceMode: tc.conformance}, protoPool(), true)
		s, routed := p.route(t, protoPost("/v1/chat/completions", protoChat))
		protoMustRoute(t, protoPost("/v1/chat/completions", protoChat), routed, protoPoolHostPorts)
		ans, err := s.Respond(envoy.Response{Status: 200, Served: tc.served, Chunks: [][]byte{[]byte("{}")}})
		if err != nil {
			t.Fatal(err)
		}
		if _, traced := ans.Headers.Set["x-tandem-trace"]; traced {
			t.Error("x-tandem-trace returned although the debug header is off")
		}
		got, present := ans.Headers.Set["x-conformance-test-served-endpoint"]
		if got != tc.want || present != (tc.want != "") {
			t.Errorf("conformance=%v served=%q: header %q (present %v), want %q", tc.conformance, tc.served, got, present, tc.want)
		}
	}
}

// TestProtocolConformanceMode: with the switch on, test-epp-endpoint-selection steers the pick
// (IPs or IP:ports, foreign IPs ignored, before the subset hint); with it off, it is ignored.
func TestProtocolConformanceMode(t *testing.T) {
	on := startProtoTandem(t, extproc.Options{ConformanceMode: true}, protoPool(), true)
	off := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	cases := []struct {
		name    string
		p       *protoTandem
		header  string
		subset  any
		allowed []string // nil: 503
	}{
		{"on: one pod", on, "10.0.0.2", nil, []string{"10.0.0.2:8000"}},
		{"on: one rank of a data-parallel pod", on, "10.0.0.3:8002", nil, []string{"10.0.0.3:8002"}},
		{"on: every rank of a pod", on, "10.0.0.3", nil, []string{"10.0.0.3:8000", "10.0.0.3:8002"}},
		{"on: foreign IPs ignored", on, "192.168.1.1,10.0.0.1, 172.16.0.9:8000", nil, []string{"10.0.0.1:8000"}},
		{"on: only foreign IPs", on, "192.168.1.1", nil, nil},
		{"on: header wins over the subset", on, "10.0.0.1", []string{"10.0.0.2:8000"}, []string{"10.0.0.1:8000"}},
		{"off: header ignored", off, "10.0.0.2", nil, protoPoolHostPorts},
		{"off: only foreign IPs ignored too", off, "192.168.1.1", nil, protoPoolHostPorts},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := protoPost("/v1/chat/completions", protoChat)
			req.Headers = envoy.Headers("test-epp-endpoint-selection", tc.header)
			req.Subset = tc.subset
			_, routed := tc.p.route(t, req)
			if tc.allowed == nil {
				protoExpectError(t, routed, 503, "")
				return
			}
			eps := protoMustRoute(t, req, routed, tc.allowed)
			if want := min(len(tc.allowed), 3); len(eps) != want {
				t.Errorf("destination %q: want %d endpoints", routed.Destination, want)
			}
			echo, hasEcho := routed.Headers.Set["x-echo-set-header"]
			if tc.p == on && echo != "x-conformance-test-served-endpoint:"+eps[0] {
				t.Errorf("x-echo-set-header %q, want the primary for the echo backend", echo)
			}
			if tc.p == off && hasEcho {
				t.Error("x-echo-set-header set outside conformance mode")
			}
		})
	}
}

// TestProtocolResponseStreaming: every response body chunk is answered before the next is
// sent (envoy.Stream.Respond sends one and waits), unchanged, end_of_stream on the last only.
func TestProtocolResponseStreaming(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, protoPool(), true)
	s, routed := p.route(t, protoPost("/v1/chat/completions", protoChat))
	protoMustRoute(t, protoPost("/v1/chat/completions", protoChat), routed, protoPoolHostPorts)
	var chunks [][]byte
	for i := range 20 {
		chunks = append(chunks, []byte(`data: {"choices":[{"delta":{"content":"t`+strings.Repeat("x", i)+`"}}]}`+"\n\n"))
	}
	chunks = append(chunks, []byte("data: [DONE]\n\n"))
	ans, err := s.Respond(envoy.Response{Status: 200, Served: routed.Endpoints()[0],
		Headers: envoy.Headers("content-type", "text/event-stream"), Chunks: chunks})
	if err != nil {
		t.Fatal(err)
	}
	if len(ans.Chunks) != len(chunks) {
		t.Fatalf("%d chunks answered, want %d", len(ans.Chunks), len(chunks))
	}
	for i := range chunks {
		if !bytes.Equal(ans.Chunks[i], chunks[i]) {
			t.Errorf("chunk %d came back as %q, want %q", i, ans.Chunks[i], chunks[i])
		}
	}
}

// TestProtocolTLSAndHealth: ext_proc is TLS (self-signed, ALPN h2) and refuses plain text;
// gRPC health is NOT_SERVING until the pool is synced, then SERVING, for every name Tandem
// answers, on the health port (plain, for kubelet probes) and the ext_proc port (for Envoy).
func TestProtocolTLSAndHealth(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, nil, false)
	ctx := protoCtx(t)
	health, err := grpc.NewClient(p.server.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer health.Close()
	conns := map[string]*grpc.ClientConn{"health port": health, "ext_proc port (TLS)": p.client.Conn()}
	type watch struct {
		where string
		w     healthpb.Health_WatchClient
	}
	var watches []watch
	for where, conn := range conns {
		for _, name := range []string{"inference-extension", "envoy.service.ext_proc.v3.ExternalProcessor", ""} {
			w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: name})
			if err != nil {
				t.Fatal(err)
			}
			watches = append(watches, watch{where + " " + name, w})
		}
	}
	expect := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, w := range watches {
			r, err := w.w.Recv()
			if err != nil || r.GetStatus() != want {
				t.Errorf("%s: %v %v, want %v", w.where, r.GetStatus(), err, want)
			}
		}
	}
	expect(healthpb.HealthCheckResponse_NOT_SERVING)
	p.store.Publish(pool.Info{Name: "pool"}, protoPool(), true)
	expect(healthpb.HealthCheckResponse_SERVING)

	req := protoPost("/v1/chat/completions", protoChat)
	_, routed := p.route(t, req)
	protoMustRoute(t, req, routed, protoPoolHostPorts)

	plain, err := envoy.Dial(p.server.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, _, err := plain.Route(ctx, req); err == nil {
		t.Error("the ext_proc port answered a plain-text client")
	} else if errors.Is(err, envoy.ErrProtocol) {
		t.Errorf("want a transport error, got %v", err)
	}
}
