package handoff

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/testnet"
)

func TestExecutorFailureClasses(t *testing.T) {
	cases := []struct {
		name       string
		handler    http.HandlerFunc // nil: see target
		target     func(t *testing.T) *pool.Endpoint
		timeout    time.Duration
		cancel     bool // cancel the caller's context once the request arrived
		maxBytes   int64
		wantClass  FailureClass
		wantStatus int
		wantInMsg  string
	}{
		{name: "engine 500 passes through", handler: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"kv pool exhausted"}`, 500)
		}, wantClass: ClassHTTPStatus, wantStatus: 500, wantInMsg: "kv pool exhausted"},
		{name: "engine 429 passes through", handler: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(429)
		}, wantClass: ClassHTTPStatus, wantStatus: 429},
		{name: "a redirect is not followed and becomes 502", handler: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		}, wantClass: ClassHTTPStatus, wantStatus: 502},
		{name: "201 is not the 200 a prefill answers", handler: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(201)
		}, wantClass: ClassHTTPStatus, wantStatus: 502},
		{name: "slow engine times out", handler: func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		}, timeout: 100 * time.Millisecond, wantClass: ClassTimeout, wantStatus: 503, wantInMsg: "within 100ms"},
		{name: "headers then a hanging body times out", handler: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(200)
			_, _ = w.Write([]byte(`{"id":`))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, timeout: 100 * time.Millisecond, wantClass: ClassTimeout, wantStatus: 503},
		{name: "a listener that never answers times out", target: hangingListener, timeout: 100 * time.Millisecond,
			wantClass: ClassTimeout, wantStatus: 503},
		{name: "connection refused is transport", target: closedPort, timeout: time.Second,
			wantClass: ClassTransport, wantStatus: 503, wantInMsg: "refused"},
		{name: "client cancel", handler: func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		}, cancel: true, timeout: time.Minute, wantClass: ClassCanceled, wantStatus: 503},
		{name: "bad JSON", handler: func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"id":"x",`))
		}, wantClass: ClassBadResponse, wantStatus: 503, wantInMsg: "not valid JSON"},
		{name: "oversized response", handler: func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"pad":"` + strings.Repeat("x", 100) + `"}`))
		}, maxBytes: 64, wantClass: ClassBadResponse, wantStatus: 503, wantInMsg: "exceeds 64 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			arrived := make(chan struct{}, 1)
			var target *pool.Endpoint
			if c.handler != nil {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					// Reading the body lets the server notice the client hanging up (r.Context()).
					_, _ = io.Copy(io.Discard, r.Body)
					arrived <- struct{}{}
					c.handler(w, r)
				}))
				defer srv.Close()
				target = serverEndpoint(t, srv, "prefill-0", pool.EngineVLLM, nil, nil)
			} else {
				target = c.target(t)
			}
			x := NewExecutor(c.maxBytes)
			defer x.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.cancel {
				go func() { <-arrived; cancel() }()
			}
			began := time.Now()
			body, f := x.Do(ctx, Call{Target: target, Path: "/v1/completions", Body: []byte(`{}`), Timeout: c.timeout})
			if f == nil {
				t.Fatalf("no failure; body %s", body)
			}
			if time.Since(began) > 5*time.Second {
				t.Errorf("took %s", time.Since(began))
			}
			ae := f.APIError()
			if f.Class != c.wantClass || ae.Status != c.wantStatus {
				t.Fatalf("got class %s status %d (%v), want %s %d", f.Class, ae.Status, f, c.wantClass, c.wantStatus)
			}
			wantPrefix := "prefill request failed (" + string(c.wantClass) + "): "
			if !strings.HasPrefix(ae.Message, wantPrefix) || !strings.Contains(ae.Message, c.wantInMsg) {
				t.Errorf("message %q, want prefix %q containing %q", ae.Message, wantPrefix, c.wantInMsg)
			}
			if ae.ErrorHeader() != apierror.HeaderPDPrefill || len(ae.Message) > len(wantPrefix)+maxMessageBytes+len("…") {
				t.Errorf("header %s, message length %d", ae.ErrorHeader(), len(ae.Message))
			}
		})
	}
}

// hangingListener accepts connections and never answers.
func hangingListener(t *testing.T) *pool.Endpoint {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		close(conns)
		for c := range conns {
			c.Close()
		}
	})
	a := ln.Addr().(*net.TCPAddr)
	return endpoint("prefill-hang", "127.0.0.1", a.Port, pool.EngineVLLM, nil, nil)
}

// closedPort is an address nothing listens on.
func closedPort(t *testing.T) *pool.Endpoint {
	return endpoint("prefill-gone", "127.0.0.1", testnet.RefusedPort(t), pool.EngineVLLM, nil, nil)
}

func TestExecutorSendsTheRightRequest(t *testing.T) {
	type seen struct {
		method, path string
		header       http.Header
		body         string
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.RequestURI(), r.Header.Clone(), string(b)}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	x := NewExecutor(0)
	defer x.Close()
	headers := map[string]string{
		":path": "/v1/chat/completions", ":authority": "gw", "host": "gw", "content-length": "99",
		"authorization": "Bearer k", "x-user": "u", "content-type": "text/plain", "connection": "close, X-Hop", "x-hop": "1",
		"transfer-encoding": "chunked", "x-gateway-destination-endpoint": "1.2.3.4:80", "x-prefiller-host-port": "6.6.6.6:1",
		"x-request-id": "client-id", "accept-encoding": "gzip",
	}
	body, f := x.Do(context.Background(), Call{Target: serverEndpoint(t, srv, "p", pool.EngineVLLM, nil, nil),
		Path: "/v1/chat/completions?x=1", Headers: headers, RequestID: "req-9", Body: []byte(`{"a":1}`), Timeout: time.Second})
	if f != nil {
		t.Fatal(f)
	}
	if string(body) != `{"ok":true}` {
		t.Errorf("body %s", body)
	}
	s := <-got
	if s.method != "POST" || s.path != "/v1/chat/completions?x=1" || s.body != `{"a":1}` {
		t.Errorf("request %s %s %s", s.method, s.path, s.body)
	}
	want := map[string]string{"Authorization": "Bearer k", "X-User": "u", "Content-Type": "application/json",
		"X-Request-Id": "req-9", "Content-Length": "7"}
	for k, v := range want {
		if s.header.Get(k) != v {
			t.Errorf("header %s = %q, want %q", k, s.header.Get(k), v)
		}
	}
	for _, k := range []string{"X-Gateway-Destination-Endpoint", "X-Prefiller-Host-Port", "Transfer-Encoding", ":path", "X-Hop"} {
		if v := s.header.Get(k); v != "" {
			t.Errorf("header %s forwarded: %q", k, v)
		}
	}
	if v := s.header.Values("X-Request-Id"); len(v) != 1 {
		t.Errorf("X-Request-Id values %q", v)
	}
}
