package handoff

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/sim"
)

// Contract tests: each leg Tandem builds is sent to the simulator's real PD endpoints, which
// refuse (400, naming the field) any body that breaks the engine's contract. The decode leg is
// POSTed here the way the gateway would forward it.

const simModel = "m"

func simPod(t *testing.T, engine, role string, mutate func(*sim.PodConfig)) *sim.Server {
	t.Helper()
	p := sim.DefaultParams()
	p.KVHold, p.BootstrapTimeout = 10000, 10000 // 10 s of wall time at TimeScale 0.001
	cfg := sim.PodConfig{Engine: engine, Role: role, Model: simModel, Params: p, TimeScale: 0.001}
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := sim.Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); cancel() })
	return s
}

func simEndpoint(t *testing.T, s *sim.Server, name, engine string, labels, annotations map[string]string) *pool.Endpoint {
	t.Helper()
	host, port, err := net.SplitHostPort(s.HostPort())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return endpoint(name, host, p, engine, labels, annotations)
}

// simPD is a prefill and a decode pod of one engine and one request's hand-off between them.
type simPD struct {
	p, d *sim.Server
	h    *Handoff
	path string
}

// newSimPD starts the pair (mutate applies to both pods) and prepares the hand-off of body with
// the client headers. The prefill pod carries the labels, and SGLang's bootstrap-port annotation.
func newSimPD(t *testing.T, ctx context.Context, engine string, pd config.PD, mutate func(*sim.PodConfig),
	labels, headers map[string]string, api request.API, body []byte) *simPD {
	t.Helper()
	s := &simPD{p: simPod(t, engine, sim.RolePrefill, mutate), d: simPod(t, engine, sim.RoleDecode, mutate), path: "/v1/chat/completions"}
	if api == request.APICompletions {
		s.path = "/v1/completions"
	}
	ann := map[string]string{}
	if engine == pool.EngineSGLang {
		ann[pool.AnnotationSGLangBootstrapPort] = strconv.Itoa(s.p.BootstrapPort())
	}
	a, err := NewAdapters(pd, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	s.h, err = a.New(ctx, Input{PD: pd, Headers: headers, Leg: Leg{
		RequestID: "req-1", Path: s.path, API: api, Body: body,
		Prefill: simEndpoint(t, s.p, "prefill-0", engine, labels, ann),
		Decode:  simEndpoint(t, s.d, "decode-0", engine, nil, nil)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.h.Done)
	return s
}

// simReply is a decode pod's answer.
type simReply struct {
	status int
	header http.Header
	body   []byte
}

func postJSON(t *testing.T, ctx context.Context, url string, body []byte, header map[string]string) simReply {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return simReply{resp.StatusCode, resp.Header, b}
}

// answerText is the generated text of a streamed or whole answer.
func answerText(t *testing.T, r simReply) string {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(r.body), []byte("data:")) {
		c := gjson.GetBytes(r.body, "choices.0")
		return c.Get("text").Str + c.Get("message.content").Str
	}
	var sb strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	for sc.Scan() {
		line := strings.TrimPrefix(sc.Text(), "data: ")
		if line == "" || line == "[DONE]" || !gjson.Valid(line) {
			continue
		}
		c := gjson.Get(line, "choices.0")
		sb.WriteString(c.Get("text").Str + c.Get("delta.content").Str)
	}
	return sb.String()
}

// lastInference is the body of the newest inference request a pod received.
func lastInference(t *testing.T, s *sim.Server) string {
	t.Helper()
	var last string
	for _, r := range s.Requests() {
		if r.Method == http.MethodPost && strings.HasSuffix(r.Path, "completions") {
			last = string(r.Body)
		}
	}
	return last
}

type simCase struct {
	name      string
	engine    string
	mutatePD  func(*config.PD)
	mutatePod func(*sim.PodConfig) // nil: defaults
	labels    map[string]string
	api       request.API
	stream    bool
}

func (c simCase) body() []byte {
	if c.api == request.APICompletions {
		return []byte(`{"model":"m","prompt":"tell me about the sea and the ships on it","max_tokens":6,"stream":` +
			strconv.FormatBool(c.stream) + `}`)
	}
	b := `{"model":"m","messages":[{"role":"user","content":"tell me about the sea and the ships on it"}],"max_tokens":6,"temperature":0`
	if c.stream {
		b += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return []byte(b + `}`)
}

func TestSimContractPDFlows(t *testing.T) {
	var cases []simCase
	for _, stream := range []bool{false, true} {
		for _, api := range []request.API{request.APIChatCompletions, request.APICompletions} {
			cases = append(cases,
				simCase{name: "vllm shfs", engine: pool.EngineVLLM, api: api, stream: stream},
				simCase{name: "vllm nixl by pod label", engine: pool.EngineVLLM, labels: map[string]string{pool.LabelKVConnector: "nixl"}, api: api, stream: stream},
				simCase{name: "sglang", engine: pool.EngineSGLang, api: api, stream: stream},
				simCase{name: "trtllm context_first", engine: pool.EngineTRTLLM, api: api, stream: stream},
				simCase{name: "trtllm context_first, params at top level", engine: pool.EngineTRTLLM, api: api, stream: stream,
					mutatePod: func(c *sim.PodConfig) { c.TRTParamsTopLevel = true }},
				simCase{name: "trtllm generation_first", engine: pool.EngineTRTLLM, api: api, stream: stream,
					mutatePD: func(p *config.PD) { p.TRTScheduleStyle = ScheduleGenerationFirst }},
			)
		}
	}
	for _, c := range cases {
		t.Run(c.name+"/"+string(c.api)+"/stream="+strconv.FormatBool(c.stream), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pd := config.DefaultPD()
			if c.mutatePD != nil {
				c.mutatePD(&pd)
			}
			nixl := c.labels[pool.LabelKVConnector] == "nixl"
			body := c.body()
			pair := newSimPD(t, ctx, c.engine, pd, c.mutatePod, c.labels, map[string]string{"authorization": "Bearer k"}, c.api, body)
			p, d, h := pair.p, pair.d, pair.h
			std := simPod(t, c.engine, sim.RoleStandard, nil)
			decodeBody, aerr := h.Start(ctx)
			if aerr != nil {
				t.Fatal(aerr)
			}
			got := postJSON(t, ctx, d.URL()+pair.path, decodeBody, nil)
			h.DecodeResponded()
			select {
			case <-h.PrefillSucceeded():
			case e := <-h.Failed():
				t.Fatalf("prefill leg failed: %v", e)
			case <-ctx.Done():
				t.Fatal("prefill leg never finished")
			}
			want := postJSON(t, ctx, std.URL()+pair.path, body, nil)
			if a, b := answerText(t, got), answerText(t, want); a != b || a == "" {
				t.Fatalf("PD answer %q, standard pod's %q", a, b)
			}
			if c.stream != bytes.HasPrefix(got.body, []byte("data:")) {
				t.Errorf("stream=%v but the answer is %.40q", c.stream, got.body)
			}
			// The exact bytes Tandem built are what the pods received.
			if pb := lastInference(t, p); pb != string(h.PrefillBody()) {
				t.Errorf("prefill pod received %s\nTandem built %s", pb, h.PrefillBody())
			}
			if db := lastInference(t, d); db != string(decodeBody) {
				t.Errorf("decode pod received %s\nTandem built %s", db, decodeBody)
			}
			if c.engine == pool.EngineVLLM && !nixl {
				kv := gjson.GetBytes(decodeBody, "kv_transfer_params")
				if !kv.Get("do_remote_prefill").Bool() || kv.Get("remote_host").Str != "127.0.0.1" || kv.Get("remote_port").Int() <= 0 ||
					kv.Get("remote_engine_id").Str == "" || len(kv.Get("remote_block_ids").Array()) == 0 {
					t.Errorf("decode kv_transfer_params %s", kv.Raw)
				}
			}
		})
	}
}

func TestSimContractPrefillFailures(t *testing.T) {
	cases := []struct {
		name, engine, fault string
		timeout             time.Duration
		wantStatus          int
		wantClass           FailureClass
	}{
		{name: "vllm prefill 500", engine: pool.EngineVLLM, fault: "prefill-500", wantStatus: 500, wantClass: ClassHTTPStatus},
		{name: "vllm prefill 429", engine: pool.EngineVLLM, fault: "prefill-429", wantStatus: 429, wantClass: ClassHTTPStatus},
		{name: "vllm prefill timeout", engine: pool.EngineVLLM, fault: "prefill-slow-5s", timeout: 200 * time.Millisecond, wantStatus: 503, wantClass: ClassTimeout},
		{name: "vllm prefill hang", engine: pool.EngineVLLM, fault: "prefill-hang", timeout: 200 * time.Millisecond, wantStatus: 503, wantClass: ClassTimeout},
		{name: "trt context 503", engine: pool.EngineTRTLLM, fault: "prefill-503", wantStatus: 503, wantClass: ClassHTTPStatus},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pd := config.DefaultPD()
			if c.timeout > 0 {
				pd.PrefillRequestTimeout = c.timeout
			}
			h := newSimPD(t, ctx, c.engine, pd, nil, nil, map[string]string{strings.ToLower(sim.HeaderFault): c.fault},
				request.APICompletions, []byte(`{"model":"m","prompt":"p"}`)).h
			_, aerr := h.Start(ctx)
			if aerr == nil || aerr.Status != c.wantStatus || aerr.ErrorHeader() != apierror.HeaderPDPrefill ||
				!strings.HasPrefix(aerr.Message, "prefill request failed ("+string(c.wantClass)+")") {
				t.Fatalf("got %+v", aerr)
			}
		})
	}
}

func TestSimContractSGLangPrefillFailureAbortsTheDecode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pd := config.DefaultPD()
	pd.DecodeAbortRetryDelay = 0 // one attempt; the retry is covered on a fake clock elsewhere
	pair := newSimPD(t, ctx, pool.EngineSGLang, pd, nil, nil, map[string]string{"x-sim-fault": "prefill-500"},
		request.APICompletions, []byte(`{"model":"m","prompt":"p","stream":true}`))
	d, h := pair.d, pair.h
	decodeBody, aerr := h.Start(ctx)
	if aerr != nil {
		t.Fatal(aerr)
	}
	// The decode leg waits at the rendezvous for a prefill that will never come.
	decodeDone := make(chan simReply, 1)
	go func() { decodeDone <- postJSON(t, ctx, d.URL()+"/v1/completions", decodeBody, nil) }()
	select {
	case aerr = <-h.Failed():
	case <-ctx.Done():
		t.Fatal("no failure reported")
	}
	if aerr.Status != 500 || aerr.ErrorHeader() != apierror.HeaderPDPrefill {
		t.Fatalf("got %+v", aerr)
	}
	h.Done()
	waitBackground(t, h)
	if aborts := d.Aborts(); len(aborts) != 1 || aborts[0] != h.RID() {
		t.Errorf("decode pod aborts %q, want [%q]", aborts, h.RID())
	}
	// The abort ends the waiting decode leg instead of leaving it for the bootstrap timeout.
	select {
	case r := <-decodeDone:
		if r.status == 200 && answerText(t, r) != "" {
			t.Errorf("aborted decode leg still answered %s", r.body)
		}
	case <-ctx.Done():
		t.Fatal("the aborted decode leg never ended")
	}
}

func TestSimContractSGLangDecodeStallWatchdog(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pd := config.DefaultPD()
	pd.DecodeStreamIdleTimeout = 300 * time.Millisecond
	pair := newSimPD(t, ctx, pool.EngineSGLang, pd, nil, nil, nil,
		request.APICompletions, []byte(`{"model":"m","prompt":"a story","max_tokens":12,"stream":true}`))
	d, h := pair.d, pair.h
	decodeBody, aerr := h.Start(ctx)
	if aerr != nil {
		t.Fatal(aerr)
	}
	// Drive the watchdog as the ext_proc server does: headers, then chunks, on the wall clock.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.URL()+"/v1/completions", bytes.NewReader(decodeBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sim-Fault", "decode-hang-after-2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h.DecodeResponded()
	w := NewWatchdog(pd, "ns/decode-0", pool.EngineSGLang, true)
	w.Headers()
	select {
	case <-h.PrefillSucceeded():
		w.Arm(time.Now())
	case <-ctx.Done():
		t.Fatal("prefill never succeeded")
	}
	chunks := make(chan bool)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				chunks <- false
			}
			if err != nil {
				chunks <- true
				return
			}
		}
	}()
	var verdict Verdict
	for fired := false; !fired; {
		at, ok := w.Deadline()
		if !ok {
			t.Fatal("watchdog disarmed on a stalled stream")
		}
		select {
		case end := <-chunks:
			if end {
				t.Fatal("the stream ended; the fault did not hang it")
			}
			w.Chunk(time.Now(), false)
		case <-time.After(time.Until(at)):
			verdict, fired = w.Expired(time.Now())
		}
	}
	if verdict.Phase != PhaseStreamIdle || verdict.Error != nil {
		t.Fatalf("verdict %+v, want a stream_idle cut", verdict)
	}
	h.AbortDecode(verdict.AbortReason)
	waitBackground(t, h)
	if aborts := d.Aborts(); len(aborts) != 1 || aborts[0] != h.RID() {
		t.Errorf("decode pod aborts %q, want [%q]", aborts, h.RID())
	}
}
