package sim

import (
	"fmt"
	"maps"
	"strings"
	"testing"
)

// vllmPrefillFor is the prefill body Tandem's vLLM hand-off derives from a client body of
// the API at path.
func vllmPrefillFor(path string, client map[string]any) map[string]any {
	m := maps.Clone(client)
	m["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	m["stream"] = false
	switch path {
	case "/v1/messages":
		m["max_tokens"] = 1
	case "/v1/responses":
		m["max_output_tokens"], m["store"], m["background"] = 1, false, false
	}
	return m
}

// Messages and Responses bodies are served by every pod and disaggregated by vLLM's
// kv_transfer_params round trip, answering what a combined pod answers.
func TestVLLMPDMessagesAndResponses(t *testing.T) {
	p, d := vllmPair(t)
	std := startPod(t, PodConfig{Engine: EngineVLLM})
	long := strings.Repeat("tell me a story ", 20)
	for _, tc := range []struct {
		path   string
		client map[string]any
	}{
		{"/v1/messages", map[string]any{"model": testModel, "max_tokens": 5, "stream": true, "system": "be brief",
			"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": long}}}}}},
		{"/v1/messages", map[string]any{"model": testModel, "max_tokens": 4, "messages": []any{map[string]any{"role": "user", "content": long}}}},
		{"/v1/responses", map[string]any{"model": testModel, "max_output_tokens": 5, "instructions": "be kind",
			"input": []any{map[string]any{"role": "user", "content": long}}}},
		{"/v1/responses", map[string]any{"model": testModel, "max_output_tokens": 3, "stream": true, "input": long}},
	} {
		pr := post(t, p.URL(), tc.path, mustJSON(t, vllmPrefillFor(tc.path, tc.client)))
		mustStatus(t, pr, 200)
		kv, ok := pr.json(t)["kv_transfer_params"].(map[string]any)
		if !ok || kv["do_remote_prefill"] != true {
			t.Fatalf("%s prefill answer has no kv_transfer_params: %s", tc.path, pr.body)
		}
		dec := maps.Clone(tc.client)
		dec["kv_transfer_params"] = kv
		dr := post(t, d.URL(), tc.path, mustJSON(t, dec))
		mustStatus(t, dr, 200)
		if header(t, dr, "X-Sim-Transfer-Seconds") <= 0 || header(t, dr, "X-Sim-Prefill-Seconds") != 0 {
			t.Fatalf("%s decode leg should pay transfer, not prefill: %v", tc.path, dr.header)
		}
		plain := post(t, std.URL(), tc.path, mustJSON(t, tc.client))
		mustStatus(t, plain, 200)
		if a, b := AnswerText(dr.body), AnswerText(plain.body); a != b || a == "" {
			t.Fatalf("%s: PD answer %q differs from the combined pod's %q (%s)", tc.path, a, b, dr.body)
		}
	}
}

func TestAPIValidation(t *testing.T) {
	p := startPod(t, PodConfig{Engine: EngineVLLM, Role: RolePrefill})
	std := startPod(t, PodConfig{Engine: EngineVLLM})
	msg := []any{map[string]any{"role": "user", "content": "hi"}}
	for _, tc := range []struct {
		base, path, param string
		body              map[string]any
	}{
		{std.URL(), "/v1/messages", "max_tokens", map[string]any{"model": testModel, "messages": msg}},
		{std.URL(), "/v1/messages", "messages", map[string]any{"model": testModel, "max_tokens": 2, "messages": []any{map[string]any{"role": "tool", "content": "x"}}}},
		{std.URL(), "/v1/responses", "input", map[string]any{"model": testModel, "input": 3}},
		{std.URL(), "/v1/responses", "max_output_tokens", map[string]any{"model": testModel, "input": "x", "max_output_tokens": 0}},
		// A Responses prefill leg that would be stored.
		{p.URL(), "/v1/responses", "store", func() map[string]any {
			m := vllmPrefillFor("/v1/responses", map[string]any{"model": testModel, "input": "x"})
			delete(m, "store")
			return m
		}()},
	} {
		r := post(t, tc.base, tc.path, mustJSON(t, tc.body))
		if r.status != 400 || !strings.Contains(string(r.body), `"param":"`+tc.param+`"`) {
			t.Errorf("%s %v: %d %s, want a 400 naming %s", tc.path, tc.body, r.status, r.body, tc.param)
		}
	}
}

// SGLang's /v1/messages drops the bootstrap fields: a decode pod gets a request it cannot serve.
// This is why Tandem refuses to split a Messages request on SGLang pods.
func TestSGLangMessagesLoseBootstrap(t *testing.T) {
	d := startPod(t, PodConfig{Engine: EngineSGLang, Role: RoleDecode})
	body := map[string]any{"model": testModel, "max_tokens": 2, "messages": []any{map[string]any{"role": "user", "content": "hi"}},
		"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 7, "rid": "r-1"}
	r := post(t, d.URL(), "/v1/messages", mustJSON(t, body))
	if r.status != 400 || !strings.Contains(string(r.body), "needs bootstrap_host") {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// Chat keeps them: the decode leg tries to join its prefill pod (there is none here).
	if r := post(t, d.URL(), "/v1/chat/completions", mustJSON(t, body)); !strings.Contains(string(r.body), "cannot reach the KV peer") {
		t.Fatalf("chat decode leg: %d %s", r.status, r.body)
	}
}

// Like vLLM's pydantic models (lax mode), a pod takes "stream" as any boolean spelling and a
// token limit as a whole number or a string holding one; anything else is a 400 naming it.
func TestLaxBooleansAndLimits(t *testing.T) {
	std := startPod(t, PodConfig{Engine: EngineVLLM})
	r := post(t, std.URL(), "/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"hello there"}],"stream":"yes","max_completion_tokens":"3"}`)
	mustStatus(t, r, 200)
	if !strings.Contains(string(r.body), "data: [DONE]") {
		t.Errorf(`"stream":"yes" did not stream: %s`, r.body)
	}
	for _, limit := range []string{`2.0`, `"2.0"`, `"2"`, `2e0`} {
		r = post(t, std.URL(), "/v1/completions", `{"model":"`+testModel+`","prompt":"hello","max_tokens":`+limit+`,"stream":0}`)
		mustStatus(t, r, 200)
		if u := r.json(t)["usage"].(map[string]any); fmt.Sprint(u["completion_tokens"]) != "2" {
			t.Errorf("max_tokens %s: usage %v, want 2 completion tokens", limit, u)
		}
	}
	for _, body := range []string{
		`{"model":"` + testModel + `","prompt":"x","stream":"maybe"}`,
		`{"model":"` + testModel + `","prompt":"x","max_tokens":"2.5"}`,
		`{"model":"` + testModel + `","prompt":"x","max_tokens":2.5}`,
	} {
		r := post(t, std.URL(), "/v1/completions", body)
		mustStatus(t, r, 400)
		if r.header.Get("X-Sim-Pod") == "" {
			t.Errorf("%s: a pod's 400 without X-Sim-Pod", body)
		}
	}
}
