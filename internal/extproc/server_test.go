package extproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

// recLifecycle records the lifecycle calls of one decision.
type recLifecycle struct {
	mu     sync.Mutex
	events []string
	dones  int
	err    error
}

func (l *recLifecycle) ResponseHeaders(status int, served *pool.Endpoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	hp := ""
	if served != nil {
		hp = served.HostPort()
	}
	l.events = append(l.events, fmt.Sprintf("headers %d %s", status, hp))
}

func (l *recLifecycle) ResponseBody(size int, eos bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, fmt.Sprintf("body %d %v", size, eos))
}

func (l *recLifecycle) Done(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dones++
	l.err = err
	l.events = append(l.events, "done")
}

func (l *recLifecycle) snapshot() ([]string, int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events), l.dones, l.err
}

// stubScheduler answers with what decide returns and records what it was asked.
type stubScheduler struct {
	decide func(req *request.Request, cands []*pool.Endpoint) (*picker.Decision, error)
	mu     sync.Mutex
	reqs   []*request.Request
}

func (s *stubScheduler) Schedule(_ context.Context, req *request.Request, _ *pool.Snapshot, cands []*pool.Endpoint) (*picker.Decision, error) {
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	return s.decide(req, cands)
}

// firstWith routes to the first candidates, with the given lifecycle and extras.
func firstWith(lc picker.Lifecycle, edit func(*picker.Decision)) *stubScheduler {
	return &stubScheduler{decide: func(_ *request.Request, cands []*pool.Endpoint) (*picker.Decision, error) {
		d := &picker.Decision{Strategy: "stub", Outcome: picker.OutcomeSingle, Step: "first",
			Destination: cands[:min(2, len(cands))], Lifecycle: lc, Trace: &picker.Trace{Candidates: len(cands)}}
		d.Trace.Add("first")
		if edit != nil {
			edit(d)
		}
		return d, nil
	}}
}

// recObserver records observer events; closed receives once per finished stream.
type recObserver struct {
	mu      sync.Mutex
	decided []DecisionEvent
	failed  []string
	bodies  []int
	opened  int
	panics  []string
	removed []string
	closed  chan struct{}
}

func newRecObserver() *recObserver { return &recObserver{closed: make(chan struct{}, 100)} }

func (o *recObserver) StreamOpened() { o.mu.Lock(); o.opened++; o.mu.Unlock() }
func (o *recObserver) StreamClosed() { o.closed <- struct{}{} }
func (o *recObserver) RequestBody(n int) {
	o.mu.Lock()
	o.bodies = append(o.bodies, n)
	o.mu.Unlock()
}
func (o *recObserver) Decided(e DecisionEvent) {
	o.mu.Lock()
	o.decided = append(o.decided, e)
	o.mu.Unlock()
}
func (o *recObserver) RequestFailed(status int, reason string) {
	o.mu.Lock()
	o.failed = append(o.failed, fmt.Sprintf("%d %s", status, reason))
	o.mu.Unlock()
}

func (o *recObserver) Panicked(where string) {
	o.mu.Lock()
	o.panics = append(o.panics, where)
	o.mu.Unlock()
}
func (o *recObserver) FieldsRemoved(fields []string) {
	o.mu.Lock()
	o.removed = append(o.removed, fields...)
	o.mu.Unlock()
}

// waitClosed waits until the server has finished n more streams.
func (o *recObserver) waitClosed(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-o.closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the server did not finish the stream within 10s")
		}
	}
}

// twoPods publishes 10.0.0.1:8000 and 10.0.0.2:8000.
func twoPods() *pool.Store {
	s := pool.NewStore()
	s.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{
		pool.NewEndpoint("ns", "a", "10.0.0.1", 8000, 0, nil, nil),
		pool.NewEndpoint("ns", "b", "10.0.0.2", 8000, 0, nil, nil),
	}, true)
	return s
}

// serve runs srv on a real TCP socket on 127.0.0.1 and returns a connected client.
func serve(t *testing.T, srv *Server) *envoy.Client {
	t.Helper()
	_, c := serveAt(t, srv)
	return c
}

// serveAt is serve, also returning the server's address; opts go to the gRPC server.
func serveAt(t *testing.T, srv *Server, opts ...grpc.ServerOption) (string, *envoy.Client) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	c, err := envoy.Dial(lis.Addr().String(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return lis.Addr().String(), c
}

// serveAdmitted is serve, also returning the count of streams the server has begun to read.
// Process reads a stream only past the admission check (the admitted stream's loop, or the
// refusal's wait for the headers), so once n streams were read, n were counted against
// Limits.MaxStreams.
func serveAdmitted(t *testing.T, srv *Server) (*envoy.Client, *readStreams) {
	t.Helper()
	r := &readStreams{woke: make(chan struct{}, 1)}
	_, c := serveAt(t, srv, grpc.StreamInterceptor(func(s any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(s, &firstRecv{ServerStream: ss, first: r.add})
	}))
	return c, r
}

// readStreams counts the streams whose first RecvMsg began; each one wakes wait.
type readStreams struct {
	n    atomic.Int64
	woke chan struct{}
}

func (r *readStreams) add() {
	r.n.Add(1)
	select {
	case r.woke <- struct{}{}:
	default:
	}
}

// wait waits until n streams were read, failing after 10 s.
func (r *readStreams) wait(t *testing.T, n int64) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for r.n.Load() < n {
		select {
		case <-r.woke:
		case <-timeout:
			t.Fatalf("%d of %d streams reached the server within 10s", r.n.Load(), n)
		}
	}
}

// firstRecv calls first as the stream's first RecvMsg begins.
type firstRecv struct {
	grpc.ServerStream
	once  sync.Once
	first func()
}

func (s *firstRecv) RecvMsg(m any) error {
	s.once.Do(s.first)
	return s.ServerStream.RecvMsg(m)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestLifecycleDoneOnEveryPath: Done is called exactly once, with the right error, however the stream ends.
func TestLifecycleDoneOnEveryPath(t *testing.T) {
	chat := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)}
	cases := []struct {
		name    string
		run     func(t *testing.T, s *envoy.Stream, cancel context.CancelFunc)
		events  []string
		wantErr func(error) bool
	}{
		{"response ends with a body chunk", func(t *testing.T, s *envoy.Stream, _ context.CancelFunc) {
			if _, err := s.Respond(envoy.Response{Status: 200, Served: "10.0.0.1:8000", Chunks: [][]byte{[]byte("ab"), []byte("cde")}}); err != nil {
				t.Fatal(err)
			}
		}, []string{"headers 200 10.0.0.1:8000", "body 2 false", "body 3 true", "done"}, func(err error) bool { return err == nil }},
		{"response without body", func(t *testing.T, s *envoy.Stream, _ context.CancelFunc) {
			if _, err := s.Respond(envoy.Response{Status: 204}); err != nil {
				t.Fatal(err)
			}
		}, []string{"headers 204 ", "done"}, func(err error) bool { return err == nil }},
		{"response ends with trailers", func(t *testing.T, s *envoy.Stream, _ context.CancelFunc) {
			if _, err := s.Respond(envoy.Response{Status: 200, Chunks: [][]byte{[]byte("x")}, Trailers: true}); err != nil {
				t.Fatal(err)
			}
		}, []string{"headers 200 ", "body 1 false", "done"}, func(err error) bool { return err == nil }},
		{"client cancels mid-response", func(t *testing.T, s *envoy.Stream, cancel context.CancelFunc) {
			if err := s.SendResponseHeaders(200, nil, false, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Recv(); err != nil {
				t.Fatal(err)
			}
			cancel()
		}, []string{"headers 200 ", "done"}, func(err error) bool { return status.Code(err) == codes.Canceled }},
		{"client half-closes before the response", func(t *testing.T, s *envoy.Stream, _ context.CancelFunc) {
			if err := s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Recv(); err != io.EOF {
				t.Fatalf("after half-close: %v, want EOF", err)
			}
		}, []string{"done"}, func(err error) bool { return errors.Is(err, ErrStreamEnded) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lc := &recLifecycle{}
			obs := newRecObserver()
			c := serve(t, NewServer(twoPods(), firstWith(lc, nil), Options{Observer: obs}))
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			s, routed, err := c.Route(ctx, chat)
			if err != nil || routed.Immediate != nil {
				t.Fatalf("route: %v %+v", err, routed)
			}
			tc.run(t, s, cancel)
			cancel()
			obs.waitClosed(t, 1)
			events, dones, derr := lc.snapshot()
			if dones != 1 {
				t.Errorf("Done called %d times, want 1", dones)
			}
			if !slices.Equal(events, tc.events) {
				t.Errorf("events %q, want %q", events, tc.events)
			}
			if !tc.wantErr(derr) {
				t.Errorf("Done(%v): unexpected error", derr)
			}
		})
	}
}

// TestServedOutsideTheDestinationsIsNobody: the gateway's served endpoint reaches the
// lifecycle only when it is one of the decision's destinations; a pool pod the decision did
// not name (a confused or hostile gateway) is nobody, so no count moves to it.
func TestServedOutsideTheDestinationsIsNobody(t *testing.T) {
	chat := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)}
	for served, want := range map[string]string{"10.0.0.1:8000": "headers 200 10.0.0.1:8000", "10.0.0.2:8000": "headers 200 "} {
		lc := &recLifecycle{}
		obs := newRecObserver()
		only := func(d *picker.Decision) { d.Destination = d.Destination[:1] } // pod a only
		c := serve(t, NewServer(twoPods(), firstWith(lc, only), Options{Observer: obs}))
		ctx, cancel := context.WithCancel(testCtx(t))
		s, routed, err := c.Route(ctx, chat)
		if err != nil || routed.Immediate != nil {
			t.Fatalf("route: %v %+v", err, routed)
		}
		if _, err := s.Respond(envoy.Response{Status: 200, Served: served}); err != nil {
			t.Fatal(err)
		}
		cancel()
		obs.waitClosed(t, 1)
		if events, _, _ := lc.snapshot(); len(events) == 0 || events[0] != want {
			t.Errorf("served %s: events %q, want first %q", served, events, want)
		}
	}
}

// TestEmptyDecisionReleasesLifecycle: a scheduler that returns no destination gets a 503,
// and the lifecycle it opened is still closed once.
func TestEmptyDecisionReleasesLifecycle(t *testing.T) {
	lc := &recLifecycle{}
	sched := &stubScheduler{decide: func(*request.Request, []*pool.Endpoint) (*picker.Decision, error) {
		return &picker.Decision{Lifecycle: lc}, nil
	}}
	obs := newRecObserver()
	c := serve(t, NewServer(twoPods(), sched, Options{Observer: obs}))
	_, routed, err := c.Route(testCtx(t), envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)})
	if err != nil {
		t.Fatal(err)
	}
	if routed.Immediate == nil || routed.Immediate.Status != 503 {
		t.Fatalf("want a 503 ImmediateResponse, got %+v", routed)
	}
	obs.waitClosed(t, 1)
	if _, dones, _ := lc.snapshot(); dones != 1 {
		t.Errorf("Done called %d times, want 1", dones)
	}
}

// TestDecisionApplied: what a decision asks for reaches the wire.
func TestDecisionApplied(t *testing.T) {
	newBody := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{}}`)
	sched := firstWith(nil, func(d *picker.Decision) {
		d.SetHeaders = map[string]string{wire.HeaderPrefillerHostPort: "10.0.0.2:8000", "X-Tandem-Role": "decode",
			wire.HeaderDestination: "1.2.3.4:1"}
		d.ResponseHeaders = map[string]string{"x-tandem-strategy": "stub"}
		d.Body = newBody
	})
	obs := newRecObserver()
	c := serve(t, NewServer(twoPods(), sched, Options{Observer: obs, DebugTraceHeader: true}))
	req := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody), Headers: envoy.Headers(
		wire.HeaderPrefillerHostPort, "169.254.169.254:80", "x-gateway-destination-endpoint-served", "evil", "X-Request-Id", "r1")}
	s, routed, err := c.Route(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	set := routed.Headers.Set
	if routed.Destination != "10.0.0.1:8000,10.0.0.2:8000" {
		t.Errorf("destination %q: a strategy must not override it", routed.Destination)
	}
	if set[wire.HeaderPrefillerHostPort] != "10.0.0.2:8000" || set["x-tandem-role"] != "decode" {
		t.Errorf("decision headers not set: %v", set)
	}
	if set["content-length"] != fmt.Sprint(len(newBody)) || string(routed.Body) != string(newBody) {
		t.Errorf("mutated body: content-length %q body %q", set["content-length"], routed.Body)
	}
	// The prefiller header is overwritten (not removed, which could drop the new value); the served one removed.
	if !slices.Equal(routed.Headers.Remove, []string{"x-gateway-destination-endpoint-served"}) {
		t.Errorf("remove %v", routed.Headers.Remove)
	}
	if len(routed.Headers.Appends) != 0 {
		t.Errorf("headers %v would be appended to client values instead of replacing them", routed.Headers.Appends)
	}
	ans, err := s.Respond(envoy.Response{Status: 200, Chunks: [][]byte{[]byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if ans.Headers.Set["x-tandem-strategy"] != "stub" {
		t.Errorf("response headers %v", ans.Headers.Set)
	}
	var tr picker.Trace
	if err := json.Unmarshal([]byte(ans.Headers.Set[wire.HeaderTrace]), &tr); err != nil || !slices.Equal(tr.Steps, []string{"first"}) || tr.Candidates != 2 {
		t.Errorf("trace header %q: %v", ans.Headers.Set[wire.HeaderTrace], err)
	}
	if r := sched.reqs[0]; r.Header(wire.HeaderPrefillerHostPort) != "" || r.Header("x-gateway-destination-endpoint-served") != "" || r.ID != "r1" {
		t.Errorf("the scheduler saw client control headers or lost others: %v", r.Headers)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.decided) != 1 || obs.decided[0].Strategy != "stub" || obs.decided[0].Step != "first" || obs.decided[0].Candidates != 2 {
		t.Errorf("decided events %+v", obs.decided)
	}
	if !slices.Equal(obs.bodies, []int{len(chatBody)}) {
		t.Errorf("body sizes %v", obs.bodies)
	}
}

// TestSchedulerErrors: scheduler errors become ImmediateResponses with their own status and header.
func TestSchedulerErrors(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		status int
		header string
		reason string
	}{
		{"api error keeps its status and header", &apierror.Error{Status: 429, Type: "rate_limited", Message: "shed", Reason: "shed", Header: apierror.HeaderPDDecode}, 429, apierror.HeaderPDDecode, "shed"},
		{"plain error is a 503", errors.New("boom"), 503, apierror.HeaderRouting, "routing_failed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sched := &stubScheduler{decide: func(*request.Request, []*pool.Endpoint) (*picker.Decision, error) { return nil, tc.err }}
			obs := newRecObserver()
			c := serve(t, NewServer(twoPods(), sched, Options{Observer: obs}))
			_, routed, err := c.Route(testCtx(t), envoy.Request{Method: "POST", Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"p"}`)})
			if err != nil {
				t.Fatal(err)
			}
			im := routed.Immediate
			if im == nil || im.Status != tc.status || im.Headers[tc.header] != "true" || im.Headers["content-type"] != "application/json" {
				t.Fatalf("got %+v, want status %d with %s", im, tc.status, tc.header)
			}
			var body struct {
				Error struct {
					Code int `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(im.Body, &body); err != nil || body.Error.Code != tc.status {
				t.Errorf("error body %s: %v", im.Body, err)
			}
			obs.waitClosed(t, 1)
			obs.mu.Lock()
			defer obs.mu.Unlock()
			if want := fmt.Sprintf("%d %s", tc.status, tc.reason); !slices.Equal(obs.failed, []string{want}) {
				t.Errorf("failed events %v, want [%s]", obs.failed, want)
			}
		})
	}
}

// TestTooLargeAnsweredAtOnce: the 413 comes back as soon as the limit is crossed, before the
// rest of the body is sent; the rest is drained and the stream then ends cleanly.
func TestTooLargeAnsweredAtOnce(t *testing.T) {
	obs := newRecObserver()
	c := serve(t, NewServer(twoPods(), nil, Options{MaxBodyBytes: 10, Observer: obs}))
	s, err := c.Open(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SendRequestHeaders(envoy.Headers(":method", "POST", ":path", "/v1/completions"), false, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SendRequestBody([]byte("0123456789"), false); err != nil { // exactly the limit: fine
		t.Fatal(err)
	}
	if err := s.SendRequestBody([]byte("x"), false); err != nil { // one byte over
		t.Fatal(err)
	}
	msg, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if im := msg.GetImmediateResponse(); im == nil || im.GetStatus().GetCode() != http.StatusRequestEntityTooLarge {
		t.Fatalf("got %v, want a 413 ImmediateResponse", msg)
	}
	for range 3 {
		if err := s.SendRequestBody([]byte("more"), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SendRequestBody(nil, true); err != nil {
		t.Fatal(err)
	}
	if msg, err := s.Recv(); err != io.EOF {
		t.Fatalf("after draining: %v %v, want the stream to end cleanly", msg, err)
	}
	obs.waitClosed(t, 1)
}

// TestProtocolViolations: a gateway that breaks ext_proc gets a gRPC error naming the problem.
func TestProtocolViolations(t *testing.T) {
	cases := []struct {
		name string
		send func(s *envoy.Stream) error
		want string
	}{
		{"body before headers", func(s *envoy.Stream) error { return s.SendRequestBody([]byte("{}"), true) }, "request_body before request_headers"},
		{"trailers before headers", func(s *envoy.Stream) error { return s.SendRequestTrailers(nil) }, "request_trailers before request_headers"},
		{"two request headers", func(s *envoy.Stream) error {
			if err := s.SendRequestHeaders(nil, false, nil); err != nil {
				return err
			}
			return s.SendRequestHeaders(nil, false, nil)
		}, "a second request_headers"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := serve(t, NewServer(twoPods(), nil, Options{}))
			s, err := c.Open(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.send(s); err != nil {
				t.Fatal(err)
			}
			_, err = s.Recv()
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want FailedPrecondition mentioning %q", err, tc.want)
			}
		})
	}
}

// TestHalfCloseEndsRequest: a client that half-closes without marking the end of the body
// still gets its route (the half-close ends the request).
func TestHalfCloseEndsRequest(t *testing.T) {
	c := serve(t, NewServer(twoPods(), nil, Options{}))
	s, err := c.Open(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SendRequestHeaders(envoy.Headers(":method", "POST"), false, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SendRequestBody([]byte(chatBody), false); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	routed, err := s.ReadRoute(envoy.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if len(routed.Endpoints()) == 0 || string(routed.Body) != chatBody {
		t.Errorf("got %+v", routed)
	}
}

// TestBufferedModeWarning: a gateway announcing a body mode that cannot work is named in the log.
func TestBufferedModeWarning(t *testing.T) {
	var mu sync.Mutex
	var logs []string
	logger := funcr.New(func(prefix, args string) { mu.Lock(); logs = append(logs, args); mu.Unlock() }, funcr.Options{})
	c := serve(t, NewServer(twoPods(), nil, Options{Logger: logger}))
	for range 2 {
		s, err := c.Open(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		err = s.Send(&extprocv3.ProcessingRequest{
			Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: procmodev3.ProcessingMode_BUFFERED},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SendRequestBody([]byte(chatBody), true); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ReadRoute(envoy.Request{}); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, l := range logs {
		if strings.Contains(l, "FULL_DUPLEX_STREAMED") && strings.Contains(l, "BUFFERED") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d body-mode warnings, want exactly 1; logs: %q", n, logs)
	}
}
