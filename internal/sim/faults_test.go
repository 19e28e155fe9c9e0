package sim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

const smallBody = `{"model":"sim-model","prompt":"fault me","max_tokens":3}`

func TestPodFaultsAtRuntime(t *testing.T) {
	s := startPod(t, PodConfig{Engine: EngineVLLM})
	mustStatus(t, post(t, s.URL(), "/sim/faults", `{"error_rate":1,"error_status":503}`), 200)
	r := post(t, s.URL(), "/v1/completions", smallBody)
	if r.status != 503 || !strings.Contains(string(r.body), "simulated fault") {
		t.Fatalf("with error_rate 1: %d %s", r.status, r.body)
	}
	if f := s.Faults(); f.ErrorRate != 1 || f.ErrorStatus != 503 {
		t.Fatalf("Faults() = %+v", f)
	}
	mustStatus(t, post(t, s.URL(), "/sim/faults", `{"error_rate":3}`), 400)
	mustStatus(t, post(t, s.URL(), "/sim/faults", `{"eror_rate":1}`), 400)
	req, _ := http.NewRequest(http.MethodDelete, s.URL()+"/sim/faults", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("DELETE /sim/faults: %v %v", resp, err)
	}
	resp.Body.Close()
	mustStatus(t, post(t, s.URL(), "/v1/completions", smallBody), 200)
}

func TestFaultHeaderIsScopedByRole(t *testing.T) {
	p := startPod(t, PodConfig{Engine: EngineVLLM, Role: RolePrefill})
	d := startPod(t, PodConfig{Engine: EngineVLLM, Role: RoleDecode})
	std := startPod(t, PodConfig{Engine: EngineVLLM})
	prefillLeg := mustJSON(t, aibrixVLLMPrefill(map[string]any{"model": testModel, "prompt": "x"}))
	if r := post(t, p.URL(), "/v1/completions", prefillLeg, HeaderFault, "prefill-500"); r.status != 500 {
		t.Fatalf("prefill-500 on the prefill pod: %d %s", r.status, r.body)
	}
	mustStatus(t, post(t, d.URL(), "/v1/completions", smallBody, HeaderFault, "prefill-500"), 200)
	mustStatus(t, post(t, std.URL(), "/v1/completions", smallBody, HeaderFault, "decode-503, prefill-500"), 200)
	mustStatus(t, post(t, std.URL(), "/v1/completions", smallBody, HeaderFault, "standard-429"), 429)
	mustStatus(t, post(t, std.URL(), "/v1/completions", smallBody, HeaderFault, "502"), 502)
	for _, bad := range []string{"boom", "prefill-200", "hang-after-0", "slow-forever"} {
		if r := post(t, std.URL(), "/v1/completions", smallBody, HeaderFault, bad); r.status != 400 || !strings.Contains(string(r.body), HeaderFault) {
			t.Errorf("header %q: %d %s", bad, r.status, r.body)
		}
	}
}

// openStream starts a streaming request and returns once its headers arrived.
func openStream(t *testing.T, ctx context.Context, s *Server, fault string) *http.Response {
	return openStreamAt(t, ctx, s, "/v1/completions", `{"model":"sim-model","prompt":"stream me","max_tokens":5,"stream":true}`, fault)
}

func openStreamAt(t *testing.T, ctx context.Context, s *Server, path, body, fault string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+path, strings.NewReader(body))
	req.Header.Set(HeaderFault, fault)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// readUntilCancel reads the stream in the background; it reports what it read once the read fails.
func readUntilCancel(body io.Reader) <-chan string {
	ch := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(body)
		ch <- string(b)
	}()
	return ch
}

func TestHangBeforeFirstToken(t *testing.T) {
	s := startPod(t, PodConfig{Engine: EngineVLLM})
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"sim-model","prompt":"stream me","max_tokens":5,"stream":true}`},
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"stream":true}`},
	} {
		ctx, cancel := context.WithCancel(testCtx(t))
		resp := openStreamAt(t, ctx, s, c.path, c.body, "hang")
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%s: headers %d %v", c.path, resp.StatusCode, resp.Header)
		}
		got := readUntilCancel(resp.Body)
		if _, err := s.WaitStats(testCtx(t), func(st Stats) bool { return st.Running == 1 }); err != nil {
			t.Fatal(err)
		}
		cancel()
		if body := <-got; body != "" { // not even chat's role chunk
			t.Fatalf("%s: a request hung before its first token sent %q", c.path, body)
		}
		if _, err := s.WaitStats(testCtx(t), func(st Stats) bool { return st.Running == 0 && st.KVUsedTokens == 0 }); err != nil {
			t.Fatal(err)
		}
	}
	// Non-streaming: nothing at all until the client gives up.
	ctx2, cancel2 := context.WithTimeout(testCtx(t), 50*time.Millisecond)
	defer cancel2()
	req, _ := http.NewRequestWithContext(ctx2, http.MethodPost, s.URL()+"/v1/completions", strings.NewReader(smallBody))
	req.Header.Set(HeaderFault, "hang")
	if _, err := http.DefaultClient.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("non-streaming hang: %v", err)
	}
}

func TestHangMidStream(t *testing.T) {
	s := startPod(t, PodConfig{Engine: EngineVLLM, Faults: Faults{HangAfterTokens: 2}})
	ctx, cancel := context.WithCancel(testCtx(t))
	resp := openStream(t, ctx, s, "")
	got := readUntilCancel(resp.Body)
	// Two tokens were generated, then the pod stalls with the request still running.
	if _, err := s.WaitStats(testCtx(t), func(st Stats) bool { return st.Running == 1 && st.Generated == 2 }); err != nil {
		t.Fatal(err)
	}
	if m := get(t, s.URL()+"/metrics"); !strings.Contains(string(m.body), `vllm:generation_tokens_total{engine="0",model_name="sim-model"} 2`+"\n") {
		t.Fatalf("metrics during the stall:\n%s", m.body)
	}
	cancel()
	body := <-got
	if n := strings.Count(body, "data: "); n != 2 || strings.Contains(body, "[DONE]") {
		t.Fatalf("stream before the stall: %q", body)
	}
}

func TestSlowStart(t *testing.T) {
	s := startPod(t, PodConfig{Engine: EngineVLLM})
	start := time.Now()
	mustStatus(t, post(t, s.URL(), "/v1/completions", smallBody, HeaderFault, "slow-30ms"), 200)
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("slow-30ms answered after %v", d)
	}
}

func TestCrash(t *testing.T) {
	s := startPod(t, PodConfig{Engine: EngineVLLM})
	mustStatus(t, post(t, s.URL(), "/sim/crash", ""), 202)
	select {
	case <-s.Crashed():
	case <-testCtx(t).Done():
		t.Fatal("pod did not crash")
	}
	<-s.Done()
	if _, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(smallBody)); err == nil {
		t.Fatal("a crashed pod still answers")
	}
}

func TestRecording(t *testing.T) {
	s := startPod(t, PodConfig{Engine: EngineVLLM, RecordLimit: 2})
	odd := "{\"model\":\"sim-model\",  \"prompt\":\"caf\u00e9\",\n\"max_tokens\":1}"
	mustStatus(t, post(t, s.URL(), "/v1/completions?x=1", odd, "X-Test", "one"), 200)
	get(t, s.URL()+"/metrics")
	get(t, s.URL()+"/health")
	recs := s.Requests()
	if len(recs) != 1 {
		t.Fatalf("recorded %d requests, want 1 (scrapes and health checks are not recorded)", len(recs))
	}
	r := recs[0]
	if string(r.Body) != odd || r.Method != "POST" || r.Path != "/v1/completions?x=1" || r.Header.Get("X-Test") != "one" {
		t.Fatalf("recorded %+v", r)
	}
	var list []Recorded
	if err := json.Unmarshal(get(t, s.URL()+"/sim/requests").body, &list); err != nil || len(list) != 1 || string(list[0].Body) != odd || list[0].Text != odd {
		t.Fatalf("/sim/requests: %v %+v", err, list)
	}
	// Bad requests are recorded too; the ring keeps the newest RecordLimit.
	post(t, s.URL(), "/v1/completions", `{"bad"`)
	post(t, s.URL(), "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":1}`)
	recs = s.Requests()
	if len(recs) != 2 || string(recs[0].Body) != `{"bad"` || recs[1].Path != "/v1/chat/completions" || recs[1].Seq != 3 {
		t.Fatalf("ring: %+v", recs)
	}
	got, err := s.WaitRequest(testCtx(t), func(r Recorded) bool { return r.Path == "/v1/chat/completions" })
	if err != nil || got.Seq != 3 {
		t.Fatalf("WaitRequest: %v %+v", err, got)
	}
	s.ResetRequests()
	if len(s.Requests()) != 0 {
		t.Fatal("ResetRequests left requests")
	}
}
