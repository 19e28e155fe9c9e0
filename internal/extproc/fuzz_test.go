package extproc

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// fuzzServers are the ext_proc servers FuzzServer drives: one routing plainly, one naming a
// sidecar prefill target, one running SGLang's async "epp" hand-off against a real prefill pod.
type fuzzServers struct {
	clients []*envoy.Client
	obs     *recObserver
	lcs     *lifecycles
}

var (
	fuzzOnce sync.Once
	fuzzSrv  *fuzzServers
)

// fuzzSetup starts the servers once per process (the fuzzing engine calls the target many
// times); they live until the process ends.
func fuzzSetup(t *testing.T) *fuzzServers {
	fuzzOnce.Do(func() {
		prefill := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, `{"id":"p","choices":[]}`)
		}))
		decode := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
		}))
		pd := config.DefaultPD()
		pd.DecodeFirstResponseTimeout, pd.DecodeStreamIdleTimeout = 50*time.Millisecond, 50*time.Millisecond
		adapters, err := handoff.NewAdapters(pd, handoff.Options{})
		if err != nil {
			t.Fatal(err)
		}
		sg := pool.NewStore()
		sg.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{endpointOf(t, prefill, "a-prefill", pool.EngineSGLang),
			endpointOf(t, decode, "b-decode", pool.EngineSGLang)}, true)
		fs := &fuzzServers{obs: &recObserver{closed: make(chan struct{}, 1000)}, lcs: &lifecycles{}}
		opts := Options{Observer: fs.obs, MaxBodyBytes: 512, ConformanceMode: true, DebugTraceHeader: true,
			ResponseHeaderHold: 20 * time.Millisecond, Handoff: adapters}
		for _, s := range []struct {
			store *pool.Store
			mode  string
		}{{twoPods(), ""}, {twoPods(), config.HandoffSidecar}, {sg, config.HandoffEPP}} {
			// A cleanup-free serve: the fuzzing engine reuses these across calls.
			fs.clients = append(fs.clients, serveForever(t, NewServer(s.store, fs.lcs.scheduler(s.mode, pd), opts)))
		}
		fuzzSrv = fs
	})
	if fuzzSrv == nil {
		t.Fatal("fuzz servers failed to start")
	}
	return fuzzSrv
}

// FuzzServer feeds a real in-process ext_proc server arbitrary message sequences: request and
// response headers, body chunks, trailers, empty messages, half-closes and resets, in any order.
// Whatever arrives, the server must not panic or hang, every ImmediateResponse is an error
// status with an OpenAI-style body, and every decision's Lifecycle.Done runs exactly once.
func FuzzServer(f *testing.F) {
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	for _, seed := range []struct {
		ops  []byte
		body string
	}{
		{[]byte{0, 0, 1, 0xff, 3, 0, 4, 0, 4, 1}, chat},                            // a whole exchange
		{[]byte{1, 0, 0, 0, 0, 0}, chat},                                           // body first, headers twice
		{[]byte{0, 1, 1, 0xff, 1, 0xff, 1, 0xff, 1, 0xff}, chat},                   // over the body limit
		{[]byte{0, 0x11, 3, 0x01, 5, 0}, ""},                                       // headers-only request
		{[]byte{2, 0, 0, 2, 1, 0x40, 2, 0, 7, 0}, chat},                            // trailers end the request
		{[]byte{0, 5, 1, 0x41, 6, 0, 3, 0x10, 8, 0}, `{"model":"m","prompt":"x"}`}, // epp, then a reset
		{[]byte{0, 5, 1, 0x41, 3, 0x10, 4, 0, 4, 0, 4, 1, 5, 0}, `{"model":"m","prompt":"x"}`},
		{[]byte{9, 0, 1, 0xff, 7, 0}, chat}, // buffered mode, then half-close
		{[]byte{0, 0, 1, 0x20, 7, 0}, `{"model":`},
	} {
		f.Add(seed.ops, seed.body)
	}
	f.Fuzz(func(t *testing.T, ops []byte, body string) {
		fs := fuzzSetup(t)
		if len(ops) > 64 {
			ops = ops[:64]
		}
		which := 0
		if len(ops) > 1 {
			which = int(ops[1]) % len(fs.clients)
		}
		fs.lcs.mu.Lock()
		fs.lcs.all = nil
		fs.lcs.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := fs.clients[which].Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		answers := make(chan []*extprocv3.ProcessingResponse, 1)
		go func() {
			var got []*extprocv3.ProcessingResponse
			for {
				m, err := s.Recv()
				if err != nil {
					answers <- got
					return
				}
				got = append(got, m)
			}
		}()
		paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/models", ""}
		off := 0
		chunk := func(n int) []byte {
			n = min(n, len(body)-off)
			b := []byte(body[off : off+n])
			off += n
			return b
		}
		reset := false
	send:
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%10, ops[i+1]
			var err error
			switch op {
			case 0, 9:
				hs := envoy.Headers(":method", "POST", "content-type", "application/json", "x-request-id", "r")
				if p := paths[int(arg>>2)%len(paths)]; p != "" {
					hs = append(hs, envoy.Header{Key: ":path", Value: p})
				}
				if arg&0x80 != 0 {
					hs = append(hs, envoy.Header{Key: wire.HeaderDestination, Value: "10.9.9.9:1"},
						envoy.Header{Key: wire.HeaderTestSelection, Value: "10.0.0.2"}, envoy.Header{Key: "X-Dup", Value: "a"},
						envoy.Header{Key: "x-dup", Value: "b"})
				}
				msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
					RequestHeaders: &extprocv3.HttpHeaders{Headers: envoyHeaderMap(hs), EndOfStream: arg&0x10 != 0}}}
				if arg&0x40 != 0 { // a subset hint: the fuzzed text and one pool address
					if msg.MetadataContext, err = envoy.Subset([]string{strings.ToValidUTF8(body, ""), "10.0.0.1"}); err != nil {
						t.Fatal(err)
					}
				}
				if op == 9 {
					msg.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: procmodev3.ProcessingMode_BUFFERED}
				}
				err = s.Send(msg)
			case 1:
				err = s.SendRequestBody(chunk(int(arg>>1)), arg&1 != 0)
			case 2:
				err = s.SendRequestTrailers(nil)
			case 3:
				err = s.SendResponseHeaders([]int{200, 500, 204, 0}[int(arg>>4)%4], nil, arg&1 != 0, envoy.Served("10.0.0.1:8000"))
			case 4:
				err = s.SendResponseBody([]byte("data: x\n\n"), arg&1 != 0)
			case 5:
				err = s.SendResponseTrailers(nil)
			case 6:
				err = s.Send(&extprocv3.ProcessingRequest{})
			case 7:
				break send
			case 8:
				reset = true
				break send
			}
			if err != nil {
				break // the server ended the stream
			}
		}
		if reset {
			cancel()
		} else {
			// A half-close ends any stream: the server answers what it owes and stops.
			_ = s.CloseSend()
		}
		var got []*extprocv3.ProcessingResponse
		select {
		case got = <-answers:
		case <-time.After(10 * time.Second):
			t.Fatal("the stream did not end within 10s of the client half-closing it")
		}
		cancel()
		t.Logf("server %d: %d answers", which, len(got))
		select {
		case <-fs.obs.closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the server did not end the stream within 10s of the client going away")
		}
		for _, m := range got {
			ir := m.GetImmediateResponse()
			if ir == nil {
				continue
			}
			var doc struct {
				Error struct{ Message, Type string } `json:"error"`
			}
			if code := int(ir.GetStatus().GetCode()); code < 400 || code > 599 {
				t.Fatalf("ImmediateResponse status %d", code)
			}
			if err := json.Unmarshal(ir.GetBody(), &doc); err != nil || doc.Error.Message == "" || doc.Error.Type == "" {
				t.Fatalf("ImmediateResponse body %s: %v", ir.GetBody(), err)
			}
		}
		fs.lcs.mu.Lock()
		defer fs.lcs.mu.Unlock()
		for i, lc := range fs.lcs.all {
			if _, dones, _ := lc.snapshot(); dones != 1 {
				t.Fatalf("decision %d: Lifecycle.Done called %d times, want 1", i, dones)
			}
		}
	})
}

// envoyHeaderMap builds a header map as Envoy sends it (raw_value).
func envoyHeaderMap(hs []envoy.Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, h := range hs {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: h.Key, RawValue: []byte(h.Value)})
	}
	return m
}

// serveForever is serve without cleanup, for servers shared by every call of a fuzz target.
func serveForever(t *testing.T, srv *Server) *envoy.Client {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	c, err := envoy.Dial(lis.Addr().String(), false)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
