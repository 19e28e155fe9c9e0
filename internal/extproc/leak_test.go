package extproc

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// lifecycles hands every decision a fresh recLifecycle and keeps them all.
type lifecycles struct {
	mu  sync.Mutex
	all []*recLifecycle
}

func (l *lifecycles) next() *recLifecycle {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc := &recLifecycle{}
	l.all = append(l.all, lc)
	return lc
}

// scheduler routes like firstWith (or pdPair for mode != "") with a new lifecycle per decision.
func (l *lifecycles) scheduler(mode string, pd config.PD) *stubScheduler {
	return &stubScheduler{decide: func(_ *request.Request, cands []*pool.Endpoint) (*picker.Decision, error) {
		d := &picker.Decision{Strategy: "stub", Outcome: picker.OutcomeSingle, Destination: cands[:min(2, len(cands))],
			Lifecycle: l.next(), Trace: &picker.Trace{}}
		if mode != "" {
			d.Outcome, d.Prefill, d.Destination = picker.OutcomePD, d.Destination[:1], d.Destination[1:]
			d.Handoff, d.PD = mode, pd
		}
		return d, nil
	}}
}

// endpointOf is a pod of engine at srv's address.
func endpointOf(t *testing.T, srv *httptest.Server, name, engine string) *pool.Endpoint {
	t.Helper()
	host, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return pool.NewEndpoint("ns", name, host, int32(p), 0, map[string]string{pool.LabelEngine: engine}, nil)
}

// TestAbandonedStreamsLeaveNothingBehind opens streams, drives each to one phase of the state
// machine, and abandons it (the client cancels, as Envoy resets a stream whose client went
// away). Afterwards every stream has closed, every decision's Lifecycle.Done ran exactly once,
// every prefill leg under way was cancelled, and the goroutine count is back at its baseline:
// no Recv goroutine, hand-off goroutine or timer outlives its stream.
func TestAbandonedStreamsLeaveNothingBehind(t *testing.T) {
	var arrived, cancelled, released atomic.Int64
	arrivedC := make(chan struct{}, 1000)
	prefill := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)  // lets the server notice the client hanging up
		if r.URL.Path == "/abort_request" { // an SGLang prefill pod told to release the request's KV
			released.Add(1)
			return
		}
		arrived.Add(1)
		arrivedC <- struct{}{}
		<-r.Context().Done() // a prefill leg that only ends when Tandem cancels it
		cancelled.Add(1)
	}))
	defer prefill.Close()
	decode := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // /abort_request
	}))
	defer decode.Close()

	pd := config.DefaultPD()
	pd.DecodeAbortRetryDelay = 20 * time.Millisecond
	abortClient := &http.Client{Transport: &http.Transport{}}
	executor := handoff.NewExecutor(0)
	adapters, err := handoff.NewAdapters(pd, handoff.Options{Executor: executor, Aborter: handoff.NewAborter(abortClient, nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer adapters.Close()
	storeOf := func(engine string) *pool.Store {
		s := pool.NewStore()
		s.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{endpointOf(t, prefill, "a-prefill", engine), endpointOf(t, decode, "b-decode", engine)}, true)
		return s
	}
	lcs := &lifecycles{}
	obs := &recObserver{closed: make(chan struct{}, 10000)}
	clients := map[string]*envoy.Client{
		"plain":  serve(t, NewServer(twoPods(), lcs.scheduler("", pd), Options{Observer: obs, MaxBodyBytes: 1024})),
		"sglang": serve(t, NewServer(storeOf(pool.EngineSGLang), lcs.scheduler(config.HandoffEPP, pd), Options{Observer: obs, Handoff: adapters})),
		"vllm":   serve(t, NewServer(storeOf(pool.EngineVLLM), lcs.scheduler(config.HandoffEPP, pd), Options{Observer: obs, Handoff: adapters})),
	}
	chat := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	recv := func(t *testing.T, s *envoy.Stream, n int) {
		t.Helper()
		for range n {
			_, err := s.Recv()
			must(t, err)
		}
	}
	route := func(t *testing.T, s *envoy.Stream) {
		t.Helper()
		must(t, s.SendRequest(chat))
		r, err := s.ReadRoute(chat)
		must(t, err)
		if r.Immediate != nil {
			t.Fatalf("immediate %+v", r.Immediate)
		}
	}
	awaitPrefill := func(t *testing.T) {
		t.Helper()
		select {
		case <-arrivedC:
		case <-time.After(10 * time.Second):
			t.Fatal("the prefill leg never arrived")
		}
	}
	phases := []struct {
		client, name string
		drive        func(t *testing.T, s *envoy.Stream)
	}{
		{"plain", "opened, nothing sent", func(*testing.T, *envoy.Stream) {}},
		{"plain", "request headers, body pending", func(t *testing.T, s *envoy.Stream) {
			must(t, s.SendRequestHeaders(envoy.Headers(":method", "POST", ":path", "/v1/completions"), false, nil))
		}},
		{"plain", "mid request body", func(t *testing.T, s *envoy.Stream) {
			must(t, s.SendRequestHeaders(envoy.Headers(":method", "POST", ":path", "/v1/completions"), false, nil))
			must(t, s.SendRequestBody([]byte(`{"model":`), false))
		}},
		{"plain", "draining after a 413", func(t *testing.T, s *envoy.Stream) {
			must(t, s.SendRequestHeaders(envoy.Headers(":method", "POST", ":path", "/v1/completions"), false, nil))
			must(t, s.SendRequestBody(make([]byte, 2048), false))
			recv(t, s, 1)
		}},
		{"plain", "routed, awaiting the response", route},
		{"plain", "response headers answered", func(t *testing.T, s *envoy.Stream) {
			route(t, s)
			must(t, s.SendResponseHeaders(200, nil, false, nil))
			recv(t, s, 1)
		}},
		{"plain", "mid response body", func(t *testing.T, s *envoy.Stream) {
			route(t, s)
			must(t, s.SendResponseHeaders(200, nil, false, nil))
			must(t, s.SendResponseBody([]byte("data: x\n\n"), false))
			recv(t, s, 2)
		}},
		{"sglang", "async prefill leg running", func(t *testing.T, s *envoy.Stream) {
			route(t, s)
			awaitPrefill(t)
		}},
		{"sglang", "async prefill running, response headers held", func(t *testing.T, s *envoy.Stream) {
			route(t, s)
			awaitPrefill(t)
			must(t, s.SendResponseHeaders(200, nil, false, nil))
		}},
		{"sglang", "async prefill running, mid response", func(t *testing.T, s *envoy.Stream) {
			route(t, s)
			awaitPrefill(t)
			must(t, s.SendResponseHeaders(200, nil, false, nil))
			must(t, s.SendResponseBody([]byte("data: x\n\n"), false))
			recv(t, s, 2) // the held headers, then the chunk
		}},
		{"vllm", "sync prefill leg running", func(t *testing.T, s *envoy.Stream) {
			must(t, s.SendRequest(chat))
			awaitPrefill(t)
		}},
	}

	// Warm up: each client's connection and its server's goroutines exist before the baseline.
	for _, c := range clients {
		ctx, cancel := context.WithCancel(testCtx(t))
		s, err := c.Open(ctx)
		must(t, err)
		must(t, s.SendRequestHeaders(envoy.Headers(":method", "GET", ":path", "/v1/models"), true, nil))
		recv(t, s, 1)
		cancel()
	}
	obs.waitClosed(t, len(clients))
	baseline := settledGoroutines(0, time.Second)

	const perPhase = 15
	opened := 0
	for _, ph := range phases {
		t.Run(ph.client+"/"+ph.name, func(t *testing.T) {
			for range perPhase {
				ctx, cancel := context.WithCancel(testCtx(t))
				s, err := clients[ph.client].Open(ctx)
				must(t, err)
				opened++
				ph.drive(t, s)
				cancel()
			}
		})
	}
	obs.waitClosed(t, opened)
	lcs.mu.Lock()
	for i, lc := range lcs.all {
		if _, dones, _ := lc.snapshot(); dones != 1 {
			t.Errorf("decision %d: Lifecycle.Done called %d times, want 1", i, dones)
		}
	}
	lcs.mu.Unlock()
	executor.Close()
	abortClient.CloseIdleConnections()
	if n := settledGoroutines(baseline, 15*time.Second); n > baseline {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after %d abandoned streams, %d before:\n%s", n, opened, baseline, buf[:runtime.Stack(buf, true)])
	}
	if a, c := arrived.Load(), cancelled.Load(); a != 4*perPhase || c != a {
		t.Errorf("%d prefill legs arrived, %d were cancelled; want %d, all cancelled", a, c, 4*perPhase)
	}
	// SGLang streams abandoned before the decode leg's first chunk release the prefill pod's KV.
	if n := released.Load(); n != 2*perPhase {
		t.Errorf("%d /abort_request calls reached the prefill pod, want %d (the SGLang phases before a response chunk)", n, 2*perPhase)
	}
}

// settledGoroutines polls runtime.NumGoroutine until it is at most target or within has
// passed, and returns the last count. Goroutines ending after a stream closes (HTTP
// connections torn down, the Recv goroutine seeing the stream's end) need a moment.
func settledGoroutines(target int, within time.Duration) int {
	deadline := time.Now().Add(within)
	n := runtime.NumGoroutine()
	for time.Now().Before(deadline) && (target == 0 || n > target) {
		time.Sleep(20 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}
