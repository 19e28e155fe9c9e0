package extproc

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// enginePod is a real HTTP server playing one engine pod: it answers a prefill leg the way its
// engine does and records every /abort_request it receives.
type enginePod struct {
	srv     *httptest.Server
	mu      sync.Mutex
	aborts  []string      // the rids asked to drop
	aborted chan struct{} // receives once per /abort_request, after it is recorded
}

func newEnginePod(t *testing.T) *enginePod {
	p := &enginePod{aborted: make(chan struct{}, 16)}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/abort_request" {
			p.mu.Lock()
			p.aborts = append(p.aborts, gjson.GetBytes(body, "rid").Str)
			p.mu.Unlock()
			select {
			case p.aborted <- struct{}{}:
			default:
			}
			return
		}
		// A prefill leg: vLLM's answer carries kv_transfer_params, SGLang's is read as a 200.
		// TensorRT-LLM's context leg answers disaggregated_params.
		_, _ = io.WriteString(w, `{"id":"p","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1],"remote_host":"h","remote_port":1},`+
			`"disaggregated_params":{"request_type":"context_only","first_gen_tokens":[1],"ctx_request_id":1}}`)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// endpoint is the pod in roleset rs with role (prefill, decode), as the epp hand-off's pairs are.
func (p *enginePod) endpoint(name, role, engine string) *pool.Endpoint {
	host, port, _ := net.SplitHostPort(p.srv.Listener.Addr().String())
	n, _ := strconv.Atoi(port)
	return pool.NewEndpoint("ns", name, host, int32(n), 0, map[string]string{pool.LabelEngine: engine,
		pool.LabelRoleName: role, pool.LabelRolesetName: "rs"}, nil)
}

func (p *enginePod) abortCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.aborts)
}

// watchdogStack is an ext_proc server with the epp hand-off over three pods of one engine:
// prefill, the primary decode pod and its fallback, and a scheduler that routes every request
// to that pair with pd as the decision's PD configuration.
func watchdogStack(t *testing.T, engine string, pd config.PD) (*envoy.Client, []*enginePod, []*pool.Endpoint) {
	t.Helper()
	pods := []*enginePod{newEnginePod(t), newEnginePod(t), newEnginePod(t)}
	eps := []*pool.Endpoint{pods[0].endpoint("prefill", "prefill", engine), pods[1].endpoint("decode-a", "decode", engine),
		pods[2].endpoint("decode-b", "decode", engine)}
	store := pool.NewStore()
	store.Publish(pool.Info{Name: "p"}, eps, true)
	adapters, err := handoff.NewAdapters(pd, handoff.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(adapters.Close)
	sched := &stubScheduler{decide: func(_ *request.Request, _ []*pool.Endpoint) (*picker.Decision, error) {
		return &picker.Decision{Strategy: "stub", Outcome: picker.OutcomePD, Step: "pair",
			Prefill: eps[:1], Destination: eps[1:3], Lifecycle: &recLifecycle{},
			Trace: &picker.Trace{}, Handoff: config.HandoffEPP, PD: pd}, nil
	}}
	return serve(t, NewServer(store, sched, Options{Handoff: adapters})), pods, eps
}

const watchdogBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// TestDecodeWatchdogScope: the watchdog guards SGLang decode legs by default (the seed defines
// it there: SGLang's prefill returns once the decode pod took the KV). A vLLM decode pod that
// keeps a request queued past the first-response timeout is not cut off unless the operator
// opted vLLM in with TANDEM_DECODE_WATCHDOG_ENGINES (or a profile's decodeWatchdogEngines).
func TestDecodeWatchdogScope(t *testing.T) {
	const timeout = 300 * time.Millisecond
	cases := []struct {
		name, engine string
		engines      config.EngineSet // zero: the default
		want504      bool
	}{
		{"sglang, default: guarded", pool.EngineSGLang, 0, true},
		{"vllm, default: not guarded", pool.EngineVLLM, 0, false},
		{"vllm, opted in", pool.EngineVLLM, config.EngineSetOf(pool.EngineSGLang, pool.EngineVLLM), true},
		{"trtllm, default: not guarded", pool.EngineTRTLLM, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pd := config.DefaultPD()
			pd.DecodeFirstResponseTimeout = timeout
			if tc.engines != 0 {
				pd.DecodeWatchdogEngines = tc.engines
			}
			c, _, _ := watchdogStack(t, tc.engine, pd)
			s, err := c.Open(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			req := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(watchdogBody)}
			if err := s.SendRequest(req); err != nil {
				t.Fatal(err)
			}
			r, err := s.ReadRoute(req)
			if err != nil || r.Immediate != nil {
				t.Fatalf("route: %v %+v", err, r)
			}
			if tc.want504 {
				// The decode pod never answers: the watchdog answers 504 with x-error-pd-decode.
				msg, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				ir := msg.GetImmediateResponse()
				if ir == nil || ir.GetStatus().GetCode() != 504 {
					t.Fatalf("got %v, want the watchdog's 504", msg)
				}
				return
			}
			// Well past the timeout the decode pod starts answering: the stream carries it.
			time.Sleep(3 * timeout)
			if err := s.SendResponseHeaders(200, nil, false, envoy.Served(r.Endpoints()[0])); err != nil {
				t.Fatal(err)
			}
			if err := s.SendResponseBody([]byte("data: [DONE]\n\n"), true); err != nil {
				t.Fatal(err)
			}
			for i := range 2 { // the headers answer, then the chunk
				msg, err := s.Recv()
				if err != nil || msg.GetImmediateResponse() != nil {
					t.Fatalf("answer %d: %v %v, want the response passed through", i, msg, err)
				}
			}
		})
	}
}

// TestWatchdogAbortsTheDecodePodThatServed: when the gateway served the request from a fallback
// decode pod (x-gateway-destination-endpoint-served names it), the watchdog's /abort_request
// goes to that pod, which holds the rid, not to the first destination.
func TestWatchdogAbortsTheDecodePodThatServed(t *testing.T) {
	pd := config.DefaultPD()
	pd.DecodeFirstResponseTimeout = 200 * time.Millisecond
	c, pods, eps := watchdogStack(t, pool.EngineSGLang, pd)
	s, err := c.Open(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	req := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(watchdogBody)}
	if err := s.SendRequest(req); err != nil {
		t.Fatal(err)
	}
	r, err := s.ReadRoute(req)
	if err != nil || r.Immediate != nil {
		t.Fatalf("route: %v %+v", err, r)
	}
	rid := gjson.GetBytes(r.Body, "rid").Str
	// The first destination refused the connection; the gateway served from the fallback, whose
	// headers arrive (held until the first token), and then no token: the client gets the 504,
	// which names the pod that stalled.
	if err := s.SendResponseHeaders(200, nil, false, envoy.Served(eps[2].HostPort())); err != nil {
		t.Fatal(err)
	}
	msg, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	ir := msg.GetImmediateResponse()
	if ir == nil || ir.GetStatus().GetCode() != 504 {
		t.Fatalf("got %v, want the watchdog's 504", msg)
	}
	if m := gjson.GetBytes(ir.GetBody(), "error.message").Str; !strings.Contains(m, eps[2].PodKey()) {
		t.Errorf("504 message %q does not name the serving pod %s", m, eps[2].PodKey())
	}
	select {
	case <-pods[2].aborted:
	case <-time.After(5 * time.Second):
	}
	pods[2].mu.Lock()
	got := append([]string(nil), pods[2].aborts...)
	pods[2].mu.Unlock()
	if len(got) != 1 || got[0] != rid || rid == "" {
		t.Errorf("the serving decode pod got aborts %v, want one for rid %q", got, rid)
	}
	if n := pods[1].abortCount(); n != 0 {
		t.Errorf("the first destination, which never had the request, got %d aborts", n)
	}
}
