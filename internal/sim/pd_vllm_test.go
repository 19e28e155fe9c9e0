package sim

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
)

// aibrixVLLMPrefill is the prefill body AIBrix (and the llm-d sidecar) derive from a client body.
func aibrixVLLMPrefill(client map[string]any) map[string]any {
	m := maps.Clone(client)
	m["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	m["max_tokens"], m["max_completion_tokens"], m["stream"] = 1, 1, false
	delete(m, "stream_options")
	delete(m, "min_tokens")
	return m
}

func vllmPair(t *testing.T) (p, d *Server) {
	return startPod(t, PodConfig{Engine: EngineVLLM, Role: RolePrefill}), startPod(t, PodConfig{Engine: EngineVLLM, Role: RoleDecode})
}

func TestVLLMPDFlow(t *testing.T) {
	p, d := vllmPair(t)
	std := startPod(t, PodConfig{Engine: EngineVLLM})
	client := map[string]any{"model": testModel, "messages": []any{map[string]any{"role": "user", "content": strings.Repeat("tell me a story ", 20)}},
		"max_tokens": 6, "stream": true, "stream_options": map[string]any{"include_usage": true}, "opaque": "kept"}
	pr := post(t, p.URL(), "/v1/chat/completions", mustJSON(t, aibrixVLLMPrefill(client)))
	mustStatus(t, pr, 200)
	kv, _ := pr.json(t)["kv_transfer_params"].(map[string]any)
	if kv["do_remote_prefill"] != true || kv["do_remote_decode"] != false || kv["remote_engine_id"] != p.EngineID() ||
		kv["remote_host"] != "127.0.0.1" || kv["tp_size"] != json.Number("1") {
		t.Fatalf("prefill kv_transfer_params %v", kv)
	}
	if port, _ := kv["remote_port"].(json.Number).Int64(); int(port) != p.BootstrapPort() {
		t.Fatalf("remote_port %v, want the side channel port %d", kv["remote_port"], p.BootstrapPort())
	}
	// "user\n" + 320 bytes + "\n" = 326 bytes = 82 prompt tokens, 6 blocks of 16, stay held on the prefill pod until the decode pulls them.
	if st := p.Stats(); st.KVUsedTokens != 96 || st.Running != 0 {
		t.Fatalf("prefill pod after its leg: %+v", st)
	}
	dec := maps.Clone(client)
	dec["kv_transfer_params"] = kv
	dr := post(t, d.URL(), "/v1/chat/completions", mustJSON(t, dec))
	mustStatus(t, dr, 200)
	if header(t, dr, "X-Sim-Transfer-Seconds") <= 0 || header(t, dr, "X-Sim-Prefill-Seconds") != 0 {
		t.Fatalf("decode leg should pay transfer, not prefill: %v", dr.header)
	}
	if st := p.Stats(); st.KVUsedTokens != 0 {
		t.Fatalf("prefill pod still holds KV after the pull: %+v", st)
	}
	plain := post(t, std.URL(), "/v1/chat/completions", mustJSON(t, client))
	if a, b := streamText(t, dr.body), streamText(t, plain.body); a != b || a == "" {
		t.Fatalf("PD answer %q differs from the combined pod's %q", a, b)
	}
	// The same blocks cannot be pulled twice.
	again := post(t, d.URL(), "/v1/chat/completions", mustJSON(t, dec))
	if again.status != 400 || !strings.Contains(string(again.body), "not held") {
		t.Fatalf("second pull: %d %s", again.status, again.body)
	}
}

func TestVLLMNIXLVariant(t *testing.T) {
	p, d := vllmPair(t)
	client := map[string]any{"model": testModel, "prompt": "a neuron prompt", "max_tokens": 3}
	pre := maps.Clone(client)
	pre["max_tokens"], pre["stream"] = 1, false
	pr := post(t, p.URL(), "/v1/completions", mustJSON(t, pre))
	mustStatus(t, pr, 200)
	dec := maps.Clone(client)
	dec["disagg_prefill_resp"] = pr.json(t)
	mustStatus(t, post(t, d.URL(), "/v1/completions", mustJSON(t, dec)), 200)
}

func TestVLLMContractViolations(t *testing.T) {
	p, d := vllmPair(t)
	client := map[string]any{"model": testModel, "prompt": "the same prompt", "max_tokens": 4}
	good := aibrixVLLMPrefill(client)
	edit := func(f func(m, kv map[string]any)) string {
		m := maps.Clone(good)
		kv := maps.Clone(m["kv_transfer_params"].(map[string]any))
		m["kv_transfer_params"] = kv
		f(m, kv)
		return mustJSON(t, m)
	}
	prefill := []struct {
		name, body, want string
	}{
		{"stream true", edit(func(m, _ map[string]any) { m["stream"] = true }), "stream"},
		{"stream_options kept", edit(func(m, _ map[string]any) { m["stream_options"] = map[string]any{"include_usage": true} }), "stream_options"},
		{"max_tokens not 1", edit(func(m, _ map[string]any) { m["max_tokens"] = 4 }), "max_tokens"},
		{"max_tokens missing", edit(func(m, _ map[string]any) { delete(m, "max_tokens") }), "max_tokens"},
		{"max_completion_tokens 4", edit(func(m, _ map[string]any) { m["max_completion_tokens"] = 4 }), "max_completion_tokens"},
		{"remote_host missing", edit(func(_, kv map[string]any) { delete(kv, "remote_host") }), "remote_host"},
		{"remote_port set", edit(func(_, kv map[string]any) { kv["remote_port"] = 1 }), "remote_port"},
		{"do_remote_prefill missing", edit(func(_, kv map[string]any) { delete(kv, "do_remote_prefill") }), "do_remote_prefill"},
		{"do_remote_decode a string", edit(func(_, kv map[string]any) { kv["do_remote_decode"] = "true" }), "do_remote_decode"},
		{"kv_transfer_params a string", edit(func(m, _ map[string]any) { m["kv_transfer_params"] = "x" }), "must be an object"},
		{"full request to a prefill pod", mustJSON(t, client), "not a prefill leg"},
	}
	for _, c := range prefill {
		r := post(t, p.URL(), "/v1/completions", c.body)
		if r.status != 400 || !strings.Contains(string(r.body), c.want) {
			t.Errorf("prefill %s: %d %s, want 400 naming %q", c.name, r.status, r.body, c.want)
		}
	}
	if r := post(t, d.URL(), "/v1/completions", mustJSON(t, good)); r.status != 400 || !strings.Contains(string(r.body), "role is decode") {
		t.Errorf("prefill leg to a decode pod: %d %s", r.status, r.body)
	}

	pr := post(t, p.URL(), "/v1/completions", mustJSON(t, good))
	mustStatus(t, pr, 200)
	kvGood := pr.json(t)["kv_transfer_params"].(map[string]any)
	dedit := func(f func(m, kv map[string]any)) string {
		m := maps.Clone(client)
		kv := maps.Clone(kvGood)
		m["kv_transfer_params"] = kv
		f(m, kv)
		return mustJSON(t, m)
	}
	decode := []struct {
		name, body, want string
	}{
		{"unknown engine id", dedit(func(_, kv map[string]any) { kv["remote_engine_id"] = "someone-else" }), "remote_engine_id"},
		{"unknown blocks", dedit(func(_, kv map[string]any) { kv["remote_block_ids"] = []int{999999} }), "remote_block_ids"},
		{"empty blocks", dedit(func(_, kv map[string]any) { kv["remote_block_ids"] = []int{} }), "remote_block_ids"},
		{"blocks as strings", dedit(func(_, kv map[string]any) { kv["remote_block_ids"] = []string{"1"} }), "remote_block_ids"},
		{"port as string", dedit(func(_, kv map[string]any) { kv["remote_port"] = "5600" }), "remote_port"},
		{"no remote_host", dedit(func(_, kv map[string]any) { kv["remote_host"] = nil }), "remote_host"},
		{"wrong port", dedit(func(_, kv map[string]any) { kv["remote_port"] = d.BootstrapPort() }), "remote_engine_id"},
		{"do_remote_decode true", dedit(func(_, kv map[string]any) { kv["do_remote_decode"] = true }), "do_remote_decode"},
		{"other prompt", dedit(func(m, _ map[string]any) { m["prompt"] = "another prompt" }), "prompt differs"},
		{"disagg_prefill_resp without kv", mustJSON(t, map[string]any{"model": testModel, "prompt": "x", "disagg_prefill_resp": map[string]any{"id": "x"}}), "disagg_prefill_resp"},
		{"both forms", dedit(func(m, _ map[string]any) { m["disagg_prefill_resp"] = map[string]any{} }), "not both"},
	}
	for _, c := range decode {
		r := post(t, d.URL(), "/v1/completions", c.body)
		if r.status != 400 || !strings.Contains(string(r.body), c.want) {
			t.Errorf("decode %s: %d %s, want 400 naming %q", c.name, r.status, r.body, c.want)
		}
	}
	// "other prompt" consumed the held blocks (a real pull happened); the good leg now finds nothing.
	if r := post(t, d.URL(), "/v1/completions", dedit(func(_, _ map[string]any) {})); r.status != 400 {
		t.Errorf("a pull after the blocks were consumed: %d %s", r.status, r.body)
	}
	if r := post(t, p.URL(), "/v1/completions", dedit(func(_, _ map[string]any) {})); r.status != 400 || !strings.Contains(string(r.body), "role is prefill") {
		t.Errorf("decode leg to a prefill pod: %d %s", r.status, r.body)
	}
}

func TestVLLMHeldKVExpires(t *testing.T) {
	params := testParams()
	params.KVHold = 20 // 20 ms at TimeScale 0.001
	p := startPod(t, PodConfig{Engine: EngineVLLM, Role: RolePrefill, Params: params})
	mustStatus(t, post(t, p.URL(), "/v1/completions", mustJSON(t, aibrixVLLMPrefill(map[string]any{"model": testModel, "prompt": "hold me"}))), 200)
	if _, err := p.WaitStats(testCtx(t), func(st Stats) bool { return st.KVUsedTokens == 0 }); err != nil {
		t.Fatal(err)
	}
}

// AnyRole pods behave like engines in kv_both mode: any pod takes either leg.
func TestAnyRole(t *testing.T) {
	a := startPod(t, PodConfig{Engine: EngineVLLM, AnyRole: true})
	b := startPod(t, PodConfig{Engine: EngineVLLM, AnyRole: true})
	client := map[string]any{"model": testModel, "prompt": "both ways", "max_tokens": 2}
	pr := post(t, a.URL(), "/v1/completions", mustJSON(t, aibrixVLLMPrefill(client)))
	mustStatus(t, pr, 200)
	dec := maps.Clone(client)
	dec["kv_transfer_params"] = pr.json(t)["kv_transfer_params"]
	mustStatus(t, post(t, b.URL(), "/v1/completions", mustJSON(t, dec)), 200)

	// SGLang: the pod whose bootstrap server the legs name is the prefill.
	p := startPod(t, PodConfig{Engine: EngineSGLang, AnyRole: true})
	d := startPod(t, PodConfig{Engine: EngineSGLang, AnyRole: true})
	pre, sdec := sglangLegs(p, client, 1, "any-1")
	dc := postAsync(t, d.URL(), "/v1/completions", mustJSON(t, sdec))
	mustStatus(t, post(t, p.URL(), "/v1/completions", mustJSON(t, pre)), 200)
	mustStatus(t, <-dc, 200)
}

// usageCached is a streamed answer's usage: prompt and cached tokens (the last usage chunk).
func usageCached(t *testing.T, body []byte) (prompt, cached int64) {
	t.Helper()
	for _, e := range events(t, body) {
		var c struct {
			Usage *struct {
				Prompt  int64 `json:"prompt_tokens"`
				Details struct {
					Cached int64 `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if e != "[DONE]" && json.Unmarshal([]byte(e), &c) == nil && c.Usage != nil {
			prompt, cached = c.Usage.Prompt, c.Usage.Details.Cached
		}
	}
	return prompt, cached
}

// A healthy decode leg reports the pulled KV as cached tokens; a decode pod whose KV connector
// is broken (recompute_kv) never pulls, prefills the prompt itself, reports 0 cached tokens and
// still answers 200 with the same text.
func TestVLLMDecodeRecomputes(t *testing.T) {
	p, d := vllmPair(t)
	client := map[string]any{"model": testModel, "prompt": strings.Repeat("a long shared prompt ", 30),
		"max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true}}
	decodeLeg := func(fault ...string) reply {
		pr := post(t, p.URL(), "/v1/completions", mustJSON(t, aibrixVLLMPrefill(client)))
		mustStatus(t, pr, 200)
		dec := maps.Clone(client)
		dec["kv_transfer_params"] = pr.json(t)["kv_transfer_params"]
		return post(t, d.URL(), "/v1/completions", mustJSON(t, dec), fault...)
	}
	ok := decodeLeg()
	mustStatus(t, ok, 200)
	prompt, cached := usageCached(t, ok.body)
	if prompt == 0 || cached != prompt {
		t.Fatalf("healthy decode leg: usage prompt %d cached %d, want cached = prompt", prompt, cached)
	}
	if header(t, ok, "X-Sim-Cached-Tokens") != float64(prompt) {
		t.Fatalf("X-Sim-Cached-Tokens %v, want %d", ok.header.Get("X-Sim-Cached-Tokens"), prompt)
	}

	mustStatus(t, post(t, d.URL(), "/sim/faults", `{"recompute_kv":true}`), 200)
	client["prompt"] = strings.Repeat("another prompt entirely ", 30) // nothing of it in the decode pod's prefix cache
	bad := decodeLeg()
	mustStatus(t, bad, 200)
	if prompt, cached := usageCached(t, bad.body); prompt == 0 || cached != 0 {
		t.Fatalf("recomputing decode leg: usage prompt %d cached %d, want cached 0", prompt, cached)
	}
	if header(t, bad, "X-Sim-Prefill-Seconds") <= 0 || header(t, bad, "X-Sim-Transfer-Seconds") != 0 {
		t.Fatalf("recomputing decode leg should pay a prefill and no transfer: %v", bad.header)
	}
	if st := p.Stats(); st.KVUsedTokens == 0 {
		t.Fatalf("the prefill pod should still hold the KV nobody pulled: %+v", st)
	}
	if streamText(t, bad.body) == "" {
		t.Fatal("recomputing decode leg answered no text")
	}

	// The per-request header item does the same, on decode pods only.
	mustStatus(t, post(t, d.URL(), "/sim/faults", `{}`), 200)
	client["prompt"] = strings.Repeat("a third prompt ", 30)
	hdr := decodeLeg(HeaderFault, "decode-recompute")
	if _, cached := usageCached(t, hdr.body); cached != 0 {
		t.Fatalf("X-Sim-Fault decode-recompute: cached %d, want 0", cached)
	}
}

// A prefill pod whose KV channel points at the wrong port: its decode leg cannot pull. With
// kv_load_failure_policy "recompute" (vLLM's) the decode pod computes the prompt itself and
// answers 200 with nothing cached; with the default it answers the error.
func TestVLLMWrongKVPort(t *testing.T) {
	p := startPod(t, PodConfig{Engine: EngineVLLM, Role: RolePrefill, Faults: Faults{WrongKVPort: true}})
	recompute := startPod(t, PodConfig{Engine: EngineVLLM, Role: RoleDecode, KVLoadFailurePolicy: KVLoadRecompute})
	fail := startPod(t, PodConfig{Engine: EngineVLLM, Role: RoleDecode})
	client := map[string]any{"model": testModel, "prompt": strings.Repeat("wrong port prompt ", 30),
		"max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true}}
	decodeLeg := func(d *Server) reply {
		pr := post(t, p.URL(), "/v1/completions", mustJSON(t, aibrixVLLMPrefill(client)))
		mustStatus(t, pr, 200)
		kv := pr.json(t)["kv_transfer_params"].(map[string]any)
		if port, _ := kv["remote_port"].(json.Number).Int64(); int(port) == p.BootstrapPort() {
			t.Fatalf("remote_port %v is the pod's real KV port", port)
		}
		dec := maps.Clone(client)
		dec["kv_transfer_params"] = kv
		return post(t, d.URL(), "/v1/completions", mustJSON(t, dec))
	}
	r := decodeLeg(recompute)
	mustStatus(t, r, 200)
	if prompt, cached := usageCached(t, r.body); prompt == 0 || cached != 0 {
		t.Fatalf("recompute policy: usage prompt %d cached %d, want cached 0", prompt, cached)
	}
	if header(t, r, "X-Sim-Prefill-Seconds") <= 0 {
		t.Fatalf("recompute policy: no local prefill: %v", r.header)
	}
	client["prompt"] = strings.Repeat("another wrong port prompt ", 30)
	if r := decodeLeg(fail); r.status != 400 || !strings.Contains(string(r.body), "cannot reach the KV peer") {
		t.Fatalf("fail policy: %d %s", r.status, r.body)
	}
	if _, err := Start(testCtx(t), PodConfig{Engine: EngineVLLM, Model: testModel, KVLoadFailurePolicy: "retry"}); err == nil {
		t.Fatal("kv_load_failure_policy retry accepted")
	}
}

// Prefill and decode pods of different revisions: the prefill leg announces its KV format; a
// decode pod of another format cannot load the KV. With kv_load_failure_policy "recompute" it
// computes the prompt itself and answers 200 with nothing cached; with the default it answers
// the error. A decode pod of the same format pulls the KV as usual.
func TestVLLMKVFormatSkew(t *testing.T) {
	p := startPod(t, PodConfig{Engine: EngineVLLM, Role: RolePrefill, KVFormat: "a"})
	same := startPod(t, PodConfig{Engine: EngineVLLM, Role: RoleDecode, KVFormat: "a"})
	recompute := startPod(t, PodConfig{Engine: EngineVLLM, Role: RoleDecode, KVFormat: "b", KVLoadFailurePolicy: KVLoadRecompute})
	fail := startPod(t, PodConfig{Engine: EngineVLLM, Role: RoleDecode, KVFormat: "b"})
	unset := startPod(t, PodConfig{Engine: EngineVLLM, Role: RoleDecode})
	client := map[string]any{"model": testModel, "max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true}}
	decodeLeg := func(d *Server, prompt string) reply {
		client["prompt"] = strings.Repeat(prompt+" ", 30) // a prompt of its own: no prefix-cache hit
		pr := post(t, p.URL(), "/v1/completions", mustJSON(t, aibrixVLLMPrefill(client)))
		mustStatus(t, pr, 200)
		kv := pr.json(t)["kv_transfer_params"].(map[string]any)
		if kv[FieldKVFormat] != "a" {
			t.Fatalf("prefill leg's kv_transfer_params.%s = %v, want \"a\"", FieldKVFormat, kv[FieldKVFormat])
		}
		dec := maps.Clone(client)
		dec["kv_transfer_params"] = kv
		return post(t, d.URL(), "/v1/completions", mustJSON(t, dec))
	}

	r := decodeLeg(same, "same format")
	mustStatus(t, r, 200)
	if prompt, cached := usageCached(t, r.body); prompt == 0 || cached != prompt {
		t.Fatalf("same format: usage prompt %d cached %d, want all cached (pulled)", prompt, cached)
	}
	if st := p.Stats(); st.KVHeld != 0 {
		t.Fatalf("same format: the prefill pod still holds the pulled KV: %+v", st)
	}

	r = decodeLeg(recompute, "skewed recompute")
	mustStatus(t, r, 200)
	if prompt, cached := usageCached(t, r.body); prompt == 0 || cached != 0 {
		t.Fatalf("recompute policy: usage prompt %d cached %d, want cached 0", prompt, cached)
	}
	if header(t, r, "X-Sim-Prefill-Seconds") <= 0 || header(t, r, "X-Sim-Transfer-Seconds") != 0 {
		t.Fatalf("recompute policy: want a local prefill and no transfer: %v", r.header)
	}
	if st := p.Stats(); st.KVHeld != 1 {
		t.Fatalf("the prefill pod should still hold the KV nobody could load: %+v", st)
	}

	for _, c := range []struct {
		d    *Server
		want string
	}{{fail, "decode pod " + fail.cfg.Name}, {unset, "(unset)"}} {
		r = decodeLeg(c.d, "skewed fail "+c.d.cfg.Name)
		if r.status != 400 || !strings.Contains(string(r.body), "kv_transfer_params."+FieldKVFormat) || !strings.Contains(string(r.body), c.want) {
			t.Fatalf("fail policy, decode format %q: %d %s", c.d.cfg.KVFormat, r.status, r.body)
		}
	}

	// A prefill pod without a format announces none (its legs look as before).
	plain := startPod(t, PodConfig{Engine: EngineVLLM, Role: RolePrefill})
	pr := post(t, plain.URL(), "/v1/completions", mustJSON(t, aibrixVLLMPrefill(client)))
	mustStatus(t, pr, 200)
	if kv := pr.json(t)["kv_transfer_params"].(map[string]any); kv[FieldKVFormat] != nil {
		t.Fatalf("a pod without kv_format announced %v", kv[FieldKVFormat])
	}
}
