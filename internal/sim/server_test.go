package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStartValidatesConfig(t *testing.T) {
	bad := DefaultParams()
	bad.BlockSize = 0
	badChunk := DefaultParams()
	badChunk.MaxBatchedTokens = -1
	for _, c := range []struct {
		cfg  PodConfig
		want string
	}{
		{PodConfig{Engine: "tgi", Model: "m"}, "engine"},
		{PodConfig{Engine: EngineVLLM, Role: "both", Model: "m"}, "role"},
		{PodConfig{Engine: EngineVLLM}, "model"},
		{PodConfig{Engine: EngineVLLM, Model: "m", TimeScale: -1}, "time_scale"},
		{PodConfig{Engine: EngineSGLang, Model: "m", RoutingSidecar: true}, "routing_sidecar"},
		{PodConfig{Engine: EngineVLLM, Model: "m", Params: bad}, "block_size"},
		{PodConfig{Engine: EngineVLLM, Model: "m", Params: badChunk}, "max_batched_tokens"},
		{PodConfig{Engine: EngineVLLM, Model: "m", Faults: Faults{ErrorRate: 2}}, "error_rate"},
		{PodConfig{Engine: EngineVLLM, Model: "m", Addr: "127.0.0.1:notaport"}, "addr"},
	} {
		_, err := Start(context.Background(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %q", c.cfg, err, c.want)
		}
	}
}

func TestHealthAndModels(t *testing.T) {
	s := startPod(t, PodConfig{Engine: EngineVLLM, ExtraModels: []string{"lora-a"}})
	mustStatus(t, get(t, s.URL()+"/health"), 200)
	r := get(t, s.URL()+"/v1/models")
	mustStatus(t, r, 200)
	var m struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(r.body, &m); err != nil || m.Object != "list" || len(m.Data) != 2 || m.Data[0].ID != testModel || m.Data[1].ID != "lora-a" {
		t.Fatalf("/v1/models = %s (%v)", r.body, err)
	}
	// The adapter name is served too.
	mustStatus(t, post(t, s.URL(), "/v1/completions", `{"model":"lora-a","prompt":"hi","max_tokens":2}`), 200)
}

func TestCompletionsNonStreaming(t *testing.T) {
	s := startPod(t, PodConfig{Engine: EngineVLLM})
	prompt := strings.Repeat("abcd", 10) + "xy" // 42 bytes = 11 tokens
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":5}`, testModel, prompt)
	r := post(t, s.URL(), "/v1/completions", body)
	mustStatus(t, r, 200)
	var a struct {
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
			Total      int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(r.body, &a); err != nil {
		t.Fatal(err)
	}
	if a.Object != "text_completion" || a.Model != testModel || a.Usage.Prompt != 11 || a.Usage.Completion != 5 || a.Usage.Total != 16 ||
		len(a.Choices) != 1 || a.Choices[0].FinishReason != "length" {
		t.Fatalf("answer %s", r.body)
	}
	if got := len(strings.Fields(a.Choices[0].Text)); got != 5 {
		t.Fatalf("text %q has %d words, want 5", a.Choices[0].Text, got)
	}
	again := post(t, s.URL(), "/v1/completions", body)
	if answerText(t, again) != a.Choices[0].Text {
		t.Fatal("the same request must give the same text")
	}
	if r.header.Get("X-Sim-Pod") != s.Config().Name || r.header.Get("X-Sim-Prompt-Tokens") != "11" {
		t.Fatalf("X-Sim headers: %v", r.header)
	}
}

func TestChatStreamingWithUsage(t *testing.T) {
	s := startPod(t, PodConfig{Engine: EngineSGLang})
	body := `{"model":"sim-model","messages":[{"role":"user","content":"hello there"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`
	r := post(t, s.URL(), "/v1/chat/completions", body)
	mustStatus(t, r, 200)
	if ct := r.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	ev := events(t, r.body)
	// role chunk, 3 content chunks, usage chunk, [DONE]
	if len(ev) != 6 || ev[5] != "[DONE]" {
		t.Fatalf("events %q", ev)
	}
	var first, last, usage map[string]any
	_ = json.Unmarshal([]byte(ev[0]), &first)
	_ = json.Unmarshal([]byte(ev[3]), &last)
	_ = json.Unmarshal([]byte(ev[4]), &usage)
	if first["object"] != "chat.completion.chunk" || !strings.Contains(ev[0], `"role":"assistant"`) {
		t.Fatalf("first chunk %s", ev[0])
	}
	if !strings.Contains(ev[3], `"finish_reason":"length"`) || !strings.Contains(ev[2], `"finish_reason":null`) {
		t.Fatalf("finish reasons: %s / %s", ev[2], ev[3])
	}
	if _, ok := last["usage"]; !ok || last["usage"] != nil {
		t.Fatalf("with include_usage every chunk carries usage: null: %s", ev[3])
	}
	u, _ := usage["usage"].(map[string]any)
	// "user\nhello there\n" is 17 bytes = 5 tokens
	if choices, _ := usage["choices"].([]any); len(choices) != 0 || u["prompt_tokens"] != 5.0 || u["completion_tokens"] != 3.0 {
		t.Fatalf("usage chunk %s", ev[4])
	}
	// Without include_usage there is no usage chunk and no usage key.
	r = post(t, s.URL(), "/v1/completions", `{"model":"sim-model","prompt":"hi","max_tokens":2,"stream":true}`)
	ev = events(t, r.body)
	if len(ev) != 3 || strings.Contains(string(r.body), "usage") {
		t.Fatalf("events without usage: %q", ev)
	}
	if text := streamText(t, r.body); text != answerText(t, post(t, s.URL(), "/v1/completions", `{"model":"sim-model","prompt":"hi","max_tokens":2}`)) {
		t.Fatalf("streamed and non-streamed answers differ: %q", text)
	}
}

func TestBadRequests(t *testing.T) {
	s := startPod(t, PodConfig{Engine: EngineVLLM, Params: func() Params { p := DefaultParams(); p.KVTokens = 64; return p }()})
	for _, c := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"/v1/completions", `not json`, 400, "not a JSON object"},
		{"/v1/completions", `{"model":"sim-model","prompt":"a","prompt":"b"}`, 400, "prompt\\\" appears twice"},
		{"/v1/completions", `{"model":"other","prompt":"a"}`, 404, "does not exist"},
		{"/v1/completions", `{"prompt":"a"}`, 400, `"model"`},
		{"/v1/completions", `{"model":"sim-model"}`, 400, `"prompt"`},
		{"/v1/completions", `{"model":"sim-model","prompt":["a","b"]}`, 400, "batched"},
		{"/v1/completions", `{"model":"sim-model","prompt":"a","max_tokens":0}`, 400, "max_tokens"},
		{"/v1/completions", `{"model":"sim-model","prompt":"a","max_tokens":2.5}`, 400, "max_tokens"},
		{"/v1/completions", `{"model":"sim-model","prompt":"a","stream":"maybe"}`, 400, "stream"},
		{"/v1/completions", `{"model":"sim-model","prompt":"a","n":2}`, 400, "n=1"},
		{"/v1/completions", `{"model":"sim-model","prompt":"a","max_tokens":2,"min_tokens":3}`, 400, "min_tokens"},
		{"/v1/completions", `{"model":"sim-model","prompt":"a","max_tokens":100}`, 400, "KV capacity"},
		{"/v1/chat/completions", `{"model":"sim-model","messages":[]}`, 400, "messages"},
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"content":"x"}]}`, 400, "role"},
	} {
		r := post(t, s.URL(), c.path, c.body)
		if r.status != c.status || !strings.Contains(string(r.body), c.want) {
			t.Errorf("%s %s: %d %s, want %d mentioning %q", c.path, c.body, r.status, r.body, c.status, c.want)
		}
	}
	// Token-id prompts are accepted as they are.
	r := post(t, s.URL(), "/v1/completions", `{"model":"sim-model","prompt":[[101,102,103]],"max_tokens":1}`)
	mustStatus(t, r, 200)
	if r.header.Get("X-Sim-Prompt-Tokens") != "3" {
		t.Fatalf("token-id prompt counted %s tokens", r.header.Get("X-Sim-Prompt-Tokens"))
	}
}

func TestMetricsDialects(t *testing.T) {
	for _, c := range []struct {
		engine, path string
		names        []string
	}{
		{EngineVLLM, "/metrics", []string{
			`vllm:num_requests_running{engine="0",model_name="sim-model"} 0`,
			`vllm:num_requests_waiting{engine="0",model_name="sim-model"} 0`,
			`vllm:kv_cache_usage_perc{engine="0",model_name="sim-model"} 0`,
			`vllm:prompt_tokens_total{engine="0",model_name="sim-model"} 1`,
			`vllm:generation_tokens_total{engine="0",model_name="sim-model"} 2`,
			`vllm:request_prefill_time_seconds_count{engine="0",model_name="sim-model"} 1`,
			`vllm:time_to_first_token_seconds_count{engine="0",model_name="sim-model"} 1`,
			`vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="8192"} 1`,
		}},
		{EngineSGLang, "/metrics", []string{
			`sglang:num_running_reqs{model_name="sim-model"} 0`,
			`sglang:num_queue_reqs{model_name="sim-model"} 0`,
			`sglang:token_usage{model_name="sim-model"} 0`,
			`sglang:gen_throughput{model_name="sim-model"} 0`,
			`sglang:num_prefill_prealloc_queue_reqs{model_name="sim-model"} 0`,
			`sglang:num_decode_prealloc_queue_reqs{model_name="sim-model"} 0`,
			`sglang:generation_tokens_total{model_name="sim-model"} 2`,
			`sglang:cache_config_info{model_name="sim-model",num_pages="8192",page_size="16"} 1`,
			`sglang:page_size{model_name="sim-model"} 16`,
			`sglang:num_pages{model_name="sim-model"} 8192`,
		}},
		{EngineTRTLLM, "/prometheus/metrics", []string{
			`trtllm_num_requests_running{engine_type="trtllm",model_name="sim-model"} 0`,
			`trtllm_num_requests_waiting{engine_type="trtllm",model_name="sim-model"} 0`,
			`trtllm_kv_cache_utilization{engine_type="trtllm",model_name="sim-model"} 0`,
			`trtllm_kv_cache_tokens_per_block{engine_type="trtllm",model_name="sim-model"} 16`,
		}},
	} {
		s := startPod(t, PodConfig{Engine: c.engine})
		if s.MetricsPath() != c.path {
			t.Errorf("%s: MetricsPath %s, want %s", c.engine, s.MetricsPath(), c.path)
		}
		mustStatus(t, post(t, s.URL(), "/v1/completions", `{"model":"sim-model","prompt":"abc","max_tokens":2}`), 200)
		r := get(t, s.URL()+c.path)
		mustStatus(t, r, 200)
		for _, n := range c.names {
			if !strings.Contains(string(r.body), n+"\n") {
				t.Errorf("%s %s lacks %q:\n%s", c.engine, c.path, n, r.body)
			}
		}
	}
	// trtllm-serve's /metrics is JSON iteration stats, not Prometheus text.
	s := startPod(t, PodConfig{Engine: EngineTRTLLM})
	r := get(t, s.URL()+"/metrics")
	var stats []map[string]any
	if err := json.Unmarshal(r.body, &stats); err != nil || len(stats) != 1 {
		t.Fatalf("trtllm /metrics = %s (%v)", r.body, err)
	}
}

func header(t *testing.T, r reply, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(r.header.Get(name), 64)
	if err != nil {
		t.Fatalf("header %s = %q", name, r.header.Get(name))
	}
	return v
}

func TestPrefixCacheLowersPrefill(t *testing.T) {
	p := DefaultParams()                // a=0.01 b=0.00005 c=1e-8, block 16
	p.DecodeBase, p.DecodePerSeq = 0, 0 // compute-bound, so the cached tokens show
	s := startPod(t, PodConfig{Engine: EngineVLLM, Params: p})
	shared := strings.Repeat("You are a helpful assistant. ", 14)[:384] // 96 tokens = 6 blocks
	first := post(t, s.URL(), "/v1/completions", mustJSON(t, map[string]any{"model": testModel, "prompt": shared + "0123456789abcdef", "max_tokens": 1}))
	mustStatus(t, first, 200)
	// 100 tokens, none cached: 0.01 + 100·0.00005 + 100²·1e-8 = 0.0151
	if got := header(t, first, "X-Sim-Prefill-Seconds"); !near(got, 0.0151) || first.header.Get("X-Sim-Cached-Tokens") != "0" {
		t.Fatalf("first prefill %v s, cached %s; want 0.0151 and 0", got, first.header.Get("X-Sim-Cached-Tokens"))
	}
	second := post(t, s.URL(), "/v1/completions", mustJSON(t, map[string]any{"model": testModel, "prompt": shared + "fedcba9876543210", "max_tokens": 1}))
	// 6 shared blocks = 96 cached tokens; 4 left, attending to all 100: 0.01 + 4·0.00005 +
	// (100² − 96²)·1e-8 = 0.01020784
	if got := header(t, second, "X-Sim-Prefill-Seconds"); !near(got, 0.01020784) || second.header.Get("X-Sim-Cached-Tokens") != "96" {
		t.Fatalf("second prefill %v s, cached %s; want 0.01020784 and 96", got, second.header.Get("X-Sim-Cached-Tokens"))
	}
	var a struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(second.body, &a)
	if a.Usage.Details.Cached != 96 {
		t.Fatalf("usage.prompt_tokens_details.cached_tokens = %d, want 96", a.Usage.Details.Cached)
	}
	m := get(t, s.URL()+"/metrics")
	for _, want := range []string{`vllm:prefix_cache_queries_total{engine="0",model_name="sim-model"} 200`, `vllm:prefix_cache_hits_total{engine="0",model_name="sim-model"} 96`} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestQueueingAtMaxRunning(t *testing.T) {
	p := testParams()
	p.MaxRunning = 1
	s := startPod(t, PodConfig{Engine: EngineVLLM, Params: p})
	ctx, cancel := context.WithCancel(testCtx(t))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions",
		strings.NewReader(`{"model":"sim-model","prompt":"first","max_tokens":4,"stream":true}`))
	req.Header.Set(HeaderFault, "hang")
	resp, err := http.DefaultClient.Do(req) // returns once the hung request has sent its headers
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	done := make(chan reply, 1)
	go func() {
		done <- post(t, s.URL(), "/v1/completions", `{"model":"sim-model","prompt":"second","max_tokens":2}`)
	}()
	if _, err := s.WaitStats(testCtx(t), func(st Stats) bool { return st.Running == 1 && st.Waiting == 1 }); err != nil {
		t.Fatal(err)
	}
	m := get(t, s.URL()+"/metrics")
	if !strings.Contains(string(m.body), `vllm:num_requests_waiting{engine="0",model_name="sim-model"} 1`) ||
		!strings.Contains(string(m.body), `vllm:num_requests_running{engine="0",model_name="sim-model"} 1`) {
		t.Fatalf("metrics while queued:\n%s", m.body)
	}
	cancel() // the client of the hung request leaves; the second one runs
	r := <-done
	mustStatus(t, r, 200)
	if header(t, r, "X-Sim-Queue-Seconds") <= 0 {
		t.Fatal("the queued request reports no queue time")
	}
	if _, err := s.WaitStats(testCtx(t), func(st Stats) bool { return st.Running == 0 && st.Waiting == 0 && st.KVUsedTokens == 0 }); err != nil {
		t.Fatal(err)
	}
}

// With one prompt per iteration (prefill_lanes 1), a request queued behind another
// request's prefill counts as waiting, as vLLM reports it (vllm:num_requests_waiting).
func TestPrefillQueueCountsAsWaiting(t *testing.T) {
	p := testParams()
	p.PrefillPerToken = 0.01 // 1000 tokens = 10 s of model time: the first prefill takes every iteration
	p.MaxBatchedTokens = 100
	s := startPod(t, PodConfig{Engine: EngineVLLM, Params: p, TimeScale: 1})
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions",
			strings.NewReader(`{"model":"sim-model","prompt":"`+strings.Repeat("long", 1000)+`","max_tokens":1}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	if _, err := s.WaitStats(testCtx(t), func(st Stats) bool { return st.Running == 1 && st.Waiting == 0 }); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(testCtx(t))
	defer cancel2()
	go func() {
		req, _ := http.NewRequestWithContext(ctx2, http.MethodPost, s.URL()+"/v1/completions",
			strings.NewReader(`{"model":"sim-model","prompt":"second","max_tokens":1}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	st, err := s.WaitStats(testCtx(t), func(st Stats) bool { return st.Waiting == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if st.Running != 1 {
		t.Fatalf("stats %+v: want running 1 (the prefilling request), waiting 1", st)
	}
	m := get(t, s.URL()+"/metrics")
	if !strings.Contains(string(m.body), `vllm:num_requests_waiting{engine="0",model_name="sim-model"} 1`) ||
		!strings.Contains(string(m.body), `vllm:num_requests_running{engine="0",model_name="sim-model"} 1`) {
		t.Fatalf("metrics while queued behind a prefill:\n%s", m.body)
	}
	cancel2() // the queued client leaves: it stops waiting
	if _, err := s.WaitStats(testCtx(t), func(st Stats) bool { return st.Running == 1 && st.Waiting == 0 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := s.WaitStats(testCtx(t), func(st Stats) bool { return st.Running == 0 && st.Waiting == 0 && st.KVUsedTokens == 0 }); err != nil {
		t.Fatal(err)
	}
}

// On a combined pod a prefill stalls the decode steps of the sequences running there: they
// share its iterations. Model (no quadratic term, no base): a 2000-token prompt beside one
// decoding stream is chunks of 999, 999 and 2 tokens (the stream's token takes one of each
// iteration's 1000), ≈ 0.5 s each; a decode step alone is 0.01 s.
func TestPrefillStallsDecodeOnCombinedPod(t *testing.T) {
	p := testParams()
	p.PrefillBase, p.PrefillPerToken, p.PrefillQuadratic = 0, 0.0005, 0
	p.DecodeBase, p.DecodePerSeq, p.MaxBatchedTokens = 0.01, 0, 1000
	s := startPod(t, PodConfig{Engine: EngineVLLM, Params: p, TimeScale: 1})
	req, _ := http.NewRequestWithContext(testCtx(t), http.MethodPost, s.URL()+"/v1/completions",
		strings.NewReader(`{"model":"sim-model","prompt":"short","max_tokens":20,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the first token: the stream is decoding now
		t.Fatal(err)
	}
	first := time.Now()
	long := post(t, s.URL(), "/v1/completions", mustJSON(t, map[string]any{"model": testModel, "prompt": strings.Repeat("abcd", 2000), "max_tokens": 1}))
	mustStatus(t, long, 200)
	// Iterations of 1000 tokens (999 prompt + the stream's 1): 2 × 0.5 s, then the last 2
	// prompt tokens with the stream's step: 0.01 s (memory-bound) — unless the stream
	// finished first, then 0.01 s alone too. Alone on the pod: 1.0 s, then 0.01... ≥ 1.0 s.
	if got := header(t, long, "X-Sim-Prefill-Seconds"); got < 1.0 || got > 1.02+1e-9 {
		t.Fatalf("prefill beside a decoding stream took %v model s, want 1.0–1.02", got)
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatal(err)
	}
	// The stream's 19 remaining steps are 0.19 s alone; two of them share a 0.5 s iteration
	// with a chunk, so they take at least 17·0.01 + 2·0.5 = 1.17 s (0.19 s without the stall).
	if d := time.Since(first); d < 900*time.Millisecond { // margin for the client's read of the first token
		t.Fatalf("the stream's last 19 tokens took %v beside a 1 s prefill: its decode steps did not wait for the chunks", d)
	}
}
