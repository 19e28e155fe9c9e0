package handoff

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// events records what an Observer is told, in order.
type events chan string

func (e events) PrefillDone(engine string, class FailureClass, stage string, _ time.Duration) {
	e <- fmt.Sprintf("prefill %s %q %s", engine, class, stage)
}
func (e events) DecodeAbort(reason string, result AbortResult) {
	e <- "abort " + reason + " " + string(result)
}
func (e events) Panicked(where string) { e <- "panic " + where }

func (e events) expect(t *testing.T, want ...string) {
	t.Helper()
	for _, w := range want {
		select {
		case got := <-e:
			if got != w {
				t.Errorf("event %q, want %q", got, w)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no event, want %q", w)
		}
	}
}

func (e events) none(t *testing.T) {
	t.Helper()
	select {
	case got := <-e:
		t.Errorf("unexpected event %q", got)
	default:
	}
}

// prefillPod is a scripted prefill engine: each request's body goes to bodies, then reply runs.
type prefillPod struct {
	*httptest.Server
	bodies chan string
}

func newPrefillPod(t *testing.T, reply func(w http.ResponseWriter, r *http.Request)) *prefillPod {
	t.Helper()
	p := &prefillPod{bodies: make(chan string, 8)}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p.bodies <- string(b)
		reply(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

func answer(body string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(body)) }
}

func fail(status int) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) { http.Error(w, `{"error":"engine says no"}`, status) }
}

type fixture struct {
	a      *Adapters
	ev     events
	clock  *fakeClock
	pd     config.PD
	decode *pool.Endpoint
	aborts chan string
	// legs receives what each hand-off's PrefillDone is called with.
	legs chan error
}

func newFixture(t *testing.T, pd config.PD) *fixture {
	t.Helper()
	f := &fixture{ev: make(events, 32), clock: newFakeClock(), pd: pd, legs: make(chan error, 8)}
	var err error
	f.a, err = NewAdapters(pd, Options{Observer: f.ev, Aborter: NewAborter(nil, f.clock),
		Now: func() time.Time { return time.UnixMilli(1672531201000) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.a.Close)
	f.decode, f.aborts = abortServer(t)
	return f
}

func (f *fixture) handoff(t *testing.T, prefill *pool.Endpoint, api request.API, body string) *Handoff {
	t.Helper()
	path := "/v1/chat/completions"
	if api == request.APICompletions {
		path = "/v1/completions"
	}
	var legDone atomic.Int32
	h, err := f.a.New(context.Background(), Input{
		Leg:     Leg{RequestID: "req-7", Path: path, API: api, Body: []byte(body), Prefill: prefill, Decode: f.decode},
		Headers: map[string]string{"authorization": "Bearer k"}, PD: f.pd,
		PrefillDone: func(err error) {
			if f, ok := err.(*Failure); err != nil && (!ok || f == nil) {
				t.Errorf("PrefillDone(%#v): want nil or a *Failure", err)
			}
			legDone.Add(1)
			f.legs <- err
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Done()
		waitBackground(t, h)
		// Every test here starts the leg: its end is reported exactly once, whatever happened.
		if n := legDone.Load(); n != 1 {
			t.Errorf("PrefillDone called %d times, want 1", n)
		}
	})
	return h
}

// waitBackground waits (bounded) for the hand-off's goroutines to end.
func waitBackground(t *testing.T, h *Handoff) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Wait(ctx); err != nil {
		t.Error(err)
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestHandoffVLLMSync(t *testing.T) {
	f := newFixture(t, config.DefaultPD())
	pod := newPrefillPod(t, answer(`{"id":"c","kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[3],"remote_host":"x","remote_port":7}}`))
	h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineVLLM, nil, nil), request.APIChatCompletions,
		`{"model":"m","messages":[],"stream":true}`)
	if h.Async() || h.Failed() != nil || h.Engine() != "vllm/shfs" {
		t.Fatalf("async=%v failed=%v engine=%s", h.Async(), h.Failed(), h.Engine())
	}
	body, aerr := h.Start(context.Background())
	if aerr != nil {
		t.Fatal(aerr)
	}
	want := `{"model":"m","messages":[],"stream":true,"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[3],"remote_host":"127.0.0.1","remote_port":7}}`
	if string(body) != want {
		t.Errorf("decode body\n got %s\nwant %s", body, want)
	}
	if got := <-pod.bodies; got != string(h.PrefillBody()) {
		t.Errorf("prefill pod got %s, want %s", got, h.PrefillBody())
	}
	if !closed(h.PrefillSucceeded()) {
		t.Error("PrefillSucceeded not closed after a sync success")
	}
	f.ev.expect(t, `prefill vllm/shfs "" before_response`)
}

func TestHandoffSyncFailures(t *testing.T) {
	cases := []struct {
		name, engine string
		reply        func(http.ResponseWriter, *http.Request)
		wantStatus   int
		wantClass    FailureClass
	}{
		{"vllm prefill 500", pool.EngineVLLM, fail(500), 500, ClassHTTPStatus},
		{"vllm prefill 404 (model not loaded)", pool.EngineVLLM, fail(404), 404, ClassHTTPStatus},
		{"vllm prefill answers HTML", pool.EngineVLLM, answer(`<html>`), 503, ClassBadResponse},
		{"trt context answers without disaggregated_params", pool.EngineTRTLLM, answer(`{"choices":[{"text":""}]}`), 503, ClassBadResponse},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, config.DefaultPD())
			pod := newPrefillPod(t, c.reply)
			h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", c.engine, nil, nil), request.APICompletions, `{"prompt":"p"}`)
			body, aerr := h.Start(context.Background())
			if aerr == nil {
				t.Fatalf("no failure; body %s", body)
			}
			if aerr.Status != c.wantStatus || aerr.ErrorHeader() != apierror.HeaderPDPrefill ||
				!strings.HasPrefix(aerr.Message, "prefill request failed ("+string(c.wantClass)+"): ") {
				t.Fatalf("got %d %s %q", aerr.Status, aerr.ErrorHeader(), aerr.Message)
			}
			if closed(h.PrefillSucceeded()) {
				t.Error("PrefillSucceeded closed after a failure")
			}
			f.ev.expect(t, fmt.Sprintf(`prefill %s %q before_response`, h.Engine(), c.wantClass))
			f.ev.none(t)
		})
	}
}

func TestHandoffClientCancelCancelsTheSyncPrefill(t *testing.T) {
	f := newFixture(t, config.DefaultPD())
	gone := make(chan struct{})
	pod := newPrefillPod(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done(); close(gone) })
	h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineVLLM, nil, nil), request.APICompletions, `{"prompt":"p"}`)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-pod.bodies; cancel() }()
	_, aerr := h.Start(ctx)
	if aerr == nil || aerr.Status != 503 || !strings.Contains(aerr.Message, "(canceled)") {
		t.Fatalf("got %v", aerr)
	}
	<-gone // the prefill pod saw the request go away
}

func TestHandoffSGLangAsync(t *testing.T) {
	f := newFixture(t, config.DefaultPD())
	release := make(chan struct{})
	pod := newPrefillPod(t, func(w http.ResponseWriter, _ *http.Request) { <-release; _, _ = w.Write([]byte(`{"id":"x"}`)) })
	h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineSGLang, nil, nil), request.APIChatCompletions,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	body, aerr := h.Start(context.Background())
	if aerr != nil {
		t.Fatal(aerr)
	}
	// The prefill pod holds its answer, yet the decode body is already here.
	if gjson.GetBytes(body, "rid").Str != h.RID() || gjson.GetBytes(body, "bootstrap_host").Str != "127.0.0.1" {
		t.Errorf("decode body %s", body)
	}
	if got := <-pod.bodies; gjson.Get(got, "rid").Str != h.RID() || gjson.Get(got, "max_tokens").Raw != "1" {
		t.Errorf("prefill body %s", got)
	}
	if closed(h.PrefillSucceeded()) {
		t.Fatal("succeeded before the prefill pod answered")
	}
	close(release)
	<-h.PrefillSucceeded()
	f.ev.expect(t, `prefill sglang "" before_response`)
	select {
	case e := <-h.Failed():
		t.Fatalf("failure after success: %v", e)
	default:
	}
}

func TestHandoffSGLangFailureBeforeDecodeFailsFastAndAbortsTwice(t *testing.T) {
	f := newFixture(t, config.DefaultPD())
	pod := newPrefillPod(t, fail(503))
	h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineSGLang, nil, nil), request.APICompletions, `{"prompt":"p"}`)
	if _, aerr := h.Start(context.Background()); aerr != nil {
		t.Fatal(aerr)
	}
	aerr := <-h.Failed()
	if aerr.Status != 503 || aerr.ErrorHeader() != apierror.HeaderPDPrefill || !strings.Contains(aerr.Message, "(http_status)") {
		t.Fatalf("failure %+v", aerr)
	}
	h.Done() // the ext_proc server answered the client; the abort goes on
	want := `{"rid":"` + h.RID() + `"}`
	if b := <-f.aborts; b != want {
		t.Errorf("first abort %s, want %s", b, want)
	}
	<-f.clock.afters
	f.clock.Advance(f.pd.DecodeAbortRetryDelay)
	if b := <-f.aborts; b != want {
		t.Errorf("second abort %s, want %s", b, want)
	}
	f.ev.expect(t, `prefill sglang "http_status" before_response`, "abort http_status ok")
}

func TestHandoffSGLangFailureAfterDecodeRespondedIsOnlyLogged(t *testing.T) {
	f := newFixture(t, config.DefaultPD())
	release := make(chan struct{})
	pod := newPrefillPod(t, func(w http.ResponseWriter, r *http.Request) { <-release; fail(500)(w, r) })
	h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineSGLang, nil, nil), request.APICompletions, `{"prompt":"p"}`)
	if _, aerr := h.Start(context.Background()); aerr != nil {
		t.Fatal(aerr)
	}
	<-pod.bodies
	h.DecodeResponded()
	close(release)
	f.ev.expect(t, `prefill sglang "http_status" after_response`)
	waitBackground(t, h)
	select {
	case e := <-h.Failed():
		t.Fatalf("SGLang failure after the decode response was delivered: %v", e)
	default:
	}
	if len(f.aborts) != 0 {
		t.Error("abort sent after the decode leg responded")
	}
}

func TestHandoffSGLangUnreadable200IsSuccess(t *testing.T) {
	f := newFixture(t, config.DefaultPD())
	pod := newPrefillPod(t, answer(`not json`))
	h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineSGLang, nil, nil), request.APICompletions, `{"prompt":"p"}`)
	if _, aerr := h.Start(context.Background()); aerr != nil {
		t.Fatal(aerr)
	}
	<-h.PrefillSucceeded()
	f.ev.expect(t, `prefill sglang "" before_response`)
}

func TestHandoffTRTGenerationFirstFailsEvenAfterResponse(t *testing.T) {
	pd := config.DefaultPD()
	pd.TRTScheduleStyle = ScheduleGenerationFirst
	f := newFixture(t, pd)
	release := make(chan struct{})
	pod := newPrefillPod(t, func(w http.ResponseWriter, r *http.Request) { <-release; fail(500)(w, r) })
	info := serverInfoServer(t, `{"disaggregated_params":{"ctx_info_endpoint":"tcp://h:1","ctx_dp_rank":0}}`)
	// One pod answers both /server_info and the context leg: route by path.
	mux := http.NewServeMux()
	mux.Handle("/server_info", info.Config.Handler)
	mux.Handle("/", pod.Config.Handler)
	both := httptest.NewServer(mux)
	defer both.Close()
	h := f.handoff(t, serverEndpoint(t, both, "ctx-0", pool.EngineTRTLLM, nil, nil), request.APIChatCompletions, `{"messages":[]}`)
	body, aerr := h.Start(context.Background())
	if aerr != nil {
		t.Fatal(aerr)
	}
	if gjson.GetBytes(body, "disaggregated_params.schedule_style").Raw != "1" || !h.Async() || h.RID() != "" {
		t.Fatalf("generation body %s", body)
	}
	<-pod.bodies
	h.DecodeResponded()
	close(release)
	aerr = <-h.Failed()
	if aerr.Status != 500 {
		t.Fatalf("failure %+v", aerr)
	}
	f.ev.expect(t, `prefill trtllm/generation_first "http_status" after_response`)
	f.ev.none(t) // no abort: TRT has no abort API; the stream reset cancels the generation leg
}

func TestHandoffTRTGenerationFirstBadServerInfoFailsBeforeAnyLeg(t *testing.T) {
	pd := config.DefaultPD()
	pd.TRTScheduleStyle = ScheduleGenerationFirst
	f := newFixture(t, pd)
	info := serverInfoServer(t, `{"disaggregated_params":{}}`)
	_, err := f.a.New(context.Background(), Input{PD: pd, Leg: Leg{Path: "/v1/completions", Body: []byte(`{"prompt":"p"}`),
		Prefill: serverEndpoint(t, info, "ctx-0", pool.EngineTRTLLM, nil, nil), Decode: f.decode}})
	if ae := asAPIError(t, err); ae.Status != 503 || !strings.Contains(ae.Message, "ctx_info_endpoint") {
		t.Fatalf("got %v", ae)
	}
}

func TestHandoffDoneCancelsARunningAsyncPrefill(t *testing.T) {
	f := newFixture(t, config.DefaultPD())
	gone := make(chan struct{})
	pod := newPrefillPod(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done(); close(gone) })
	h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineSGLang, nil, nil), request.APICompletions, `{"prompt":"p"}`)
	if _, aerr := h.Start(context.Background()); aerr != nil {
		t.Fatal(aerr)
	}
	<-pod.bodies
	h.Done()
	<-gone
	waitBackground(t, h)
	select {
	case e := <-h.Failed():
		t.Fatalf("a request that ended reported %v", e)
	default:
	}
	if len(f.aborts) != 0 {
		t.Error("abort sent for a request that ended")
	}
	if _, aerr := h.Start(context.Background()); aerr == nil {
		t.Error("Start after Done succeeded")
	}
}

func TestHandoffWatchdogAbortIsASingleAttempt(t *testing.T) {
	f := newFixture(t, config.DefaultPD())
	pod := newPrefillPod(t, answer(`{}`))
	h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineSGLang, nil, nil), request.APICompletions, `{"prompt":"p"}`)
	if _, aerr := h.Start(context.Background()); aerr != nil {
		t.Fatal(aerr)
	}
	<-h.PrefillSucceeded()
	h.DecodeResponded()
	h.AbortDecode("watchdog_stream_idle")
	f.ev.expect(t, `prefill sglang "" before_response`, "abort watchdog_stream_idle ok")
	if b := <-f.aborts; b != `{"rid":"`+h.RID()+`"}` {
		t.Errorf("abort %s", b)
	}
	if len(f.clock.afters) != 0 || len(f.aborts) != 0 {
		t.Error("the watchdog abort was retried")
	}
}

func TestAdaptersSelection(t *testing.T) {
	cases := []struct {
		name      string
		mutate    func(*config.PD)
		engine    string
		label     string
		want      string
		wantError string
	}{
		{name: "vLLM default connector", engine: pool.EngineVLLM, want: "vllm/shfs"},
		{name: "gateway nixl", mutate: func(p *config.PD) { p.KVConnectorType = "nixl" }, engine: pool.EngineVLLM, want: "vllm/nixl"},
		{name: "pod label overrides", engine: pool.EngineVLLM, label: "nixl", want: "vllm/nixl"},
		{name: "pod label in any case (as AIBrix)", engine: pool.EngineVLLM, label: "NIXL", want: "vllm/nixl"},
		{name: "unknown pod label: the gateway's", mutate: func(p *config.PD) { p.KVConnectorType = "nixl" }, engine: pool.EngineVLLM, label: "mooncake", want: "vllm/nixl"},
		{name: "unknown gateway connector: shfs", mutate: func(p *config.PD) { p.KVConnectorType = "tcp" }, engine: pool.EngineVLLM, want: "vllm/shfs"},
		{name: "sglang", engine: pool.EngineSGLang, want: "sglang"},
		{name: "trt default", engine: pool.EngineTRTLLM, want: "trtllm/context_first"},
		{name: "trt generation_first", mutate: func(p *config.PD) { p.TRTScheduleStyle = "generation_first" }, engine: pool.EngineTRTLLM, want: "trtllm/generation_first"},
		{name: "trt unknown style", mutate: func(p *config.PD) { p.TRTScheduleStyle = "gen_first" }, engine: pool.EngineTRTLLM, want: "trtllm/context_first"},
		{name: "unknown engine", engine: "llamacpp", wantError: "model.aibrix.ai/engine=\"llamacpp\""},
		{name: "machine id out of range", mutate: func(p *config.PD) { p.TRTMachineID = 1024 }, wantError: "AIBRIX_TRT_MACHINE_ID=1024"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pd := config.DefaultPD()
			if c.mutate != nil {
				c.mutate(&pd)
			}
			a, err := NewAdapters(pd, Options{})
			if err == nil {
				defer a.Close()
				labels := map[string]string{}
				if c.label != "" {
					labels[pool.LabelKVConnector] = c.label
				}
				var e Engine
				e, err = a.For(endpoint("p0", "10.0.0.1", 8000, c.engine, labels, nil))
				if err == nil && e.Name() != c.want {
					t.Errorf("adapter %s, want %s", e.Name(), c.want)
				}
			}
			if (err != nil) != (c.wantError != "") || (err != nil && !strings.Contains(err.Error(), c.wantError)) {
				t.Errorf("err = %v, want %q", err, c.wantError)
			}
		})
	}
}

func TestEngineOf(t *testing.T) {
	v := endpoint("a", "10.0.0.1", 1, pool.EngineVLLM, nil, nil)
	unlabeled := pool.NewEndpoint("ns", "b", "10.0.0.2", 1, 0, nil, nil) // no label counts as vLLM
	s := endpoint("c", "10.0.0.3", 1, pool.EngineSGLang, nil, nil)
	if e, err := EngineOf([]*pool.Endpoint{v, unlabeled}); err != nil || e != pool.EngineVLLM {
		t.Errorf("got %q %v", e, err)
	}
	_, err := EngineOf([]*pool.Endpoint{v, unlabeled, s})
	if ae := asAPIError(t, err); ae.Status != 503 || !strings.Contains(ae.Message, "ns/c") {
		t.Errorf("got %v", ae)
	}
}

// A client that sends no :path (NGINX Gateway Fabric's shim) still gets its prefill leg sent to
// the API's OpenAI path, never to "/" (a 404 on every engine).
func TestPrefillLegPathWithoutClientPath(t *testing.T) {
	for _, tc := range []struct {
		api  request.API
		body string
		want string
	}{
		{request.APIChatCompletions, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "/v1/chat/completions"},
		{request.APICompletions, `{"model":"m","prompt":"hi"}`, "/v1/completions"},
	} {
		t.Run(string(tc.api), func(t *testing.T) {
			f := newFixture(t, config.DefaultPD())
			paths := make(chan string, 1)
			pod := newPrefillPod(t, func(w http.ResponseWriter, r *http.Request) {
				paths <- r.URL.Path
				_, _ = w.Write([]byte(`{"id":"c","kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[3],"remote_host":"x","remote_port":7}}`))
			})
			h, err := f.a.New(context.Background(), Input{
				Leg: Leg{RequestID: "req-1", API: tc.api, Body: []byte(tc.body),
					Prefill: serverEndpoint(t, pod.Server, "p0", pool.EngineVLLM, nil, nil), Decode: f.decode},
				PD: f.pd})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { h.Done(); waitBackground(t, h) }()
			if _, aerr := h.Start(context.Background()); aerr != nil {
				t.Fatal(aerr)
			}
			if got := <-paths; got != tc.want {
				t.Errorf("prefill leg sent to %q, want %q", got, tc.want)
			}
		})
	}
}

// A completed request's async prefill leg is left to read its answer: the decode leg could
// not finish without the leg's KV, so the leg succeeded, and its success is counted even when
// its answer arrives after the request ended (Done) and the stream's context is gone. Before
// Completed, Done cancelled such a leg and its success went uncounted (the TRT
// generation_first e2e flow raced on it).
func TestHandoffCompletedLeavesTheAsyncLegToFinish(t *testing.T) {
	pd := config.DefaultPD()
	pd.TRTScheduleStyle = ScheduleGenerationFirst
	f := newFixture(t, pd)
	release := make(chan struct{})
	pod := newPrefillPod(t, func(w http.ResponseWriter, r *http.Request) {
		<-release // answers once the request has ended
		answer(`{"choices":[{"text":"x","disaggregated_params":{"request_type":"context_only","first_gen_tokens":[1]}}]}`)(w, r)
	})
	info := serverInfoServer(t, `{"disaggregated_params":{"ctx_info_endpoint":"tcp://h:1","ctx_dp_rank":0}}`)
	mux := http.NewServeMux()
	mux.Handle("/server_info", info.Config.Handler)
	mux.Handle("/", pod.Config.Handler)
	both := httptest.NewServer(mux)
	defer both.Close()
	h := f.handoff(t, serverEndpoint(t, both, "ctx-0", pool.EngineTRTLLM, nil, nil), request.APIChatCompletions, `{"messages":[]}`)
	stream, endStream := context.WithCancel(context.Background())
	if _, aerr := h.Start(stream); aerr != nil {
		t.Fatal(aerr)
	}
	<-pod.bodies
	h.DecodeResponded()
	h.Completed() // the generation leg's response ended
	h.Done()
	endStream() // and the ext_proc stream closed
	close(release)
	if err := <-f.legs; err != nil {
		t.Fatalf("the completed request's prefill leg ended with %v, want success", err)
	}
	f.ev.expect(t, `prefill trtllm/generation_first "" before_response`)
}
