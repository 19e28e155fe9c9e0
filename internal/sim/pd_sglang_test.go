package sim

import (
	"maps"
	"net/http"
	"strings"
	"testing"
)

func sglangPair(t *testing.T, params Params) (p, d *Server) {
	return startPod(t, PodConfig{Engine: EngineSGLang, Role: RolePrefill, Params: params}),
		startPod(t, PodConfig{Engine: EngineSGLang, Role: RoleDecode, Params: params})
}

// sglangLegs builds both legs as AIBrix does: the same bootstrap fields and rid on both,
// the prefill leg with one output token and no streaming.
func sglangLegs(p *Server, client map[string]any, room int64, rid string) (prefill, decode map[string]any) {
	decode = maps.Clone(client)
	decode["bootstrap_host"] = "127.0.0.1"
	decode["bootstrap_port"] = p.BootstrapPort()
	decode["bootstrap_room"] = room
	decode["rid"] = rid
	prefill = maps.Clone(decode)
	prefill["max_tokens"], prefill["max_completion_tokens"], prefill["stream"] = 1, 1, false
	delete(prefill, "stream_options")
	delete(prefill, "min_tokens")
	return prefill, decode
}

func postAsync(t *testing.T, base, path, body string, hdr ...string) <-chan reply {
	ch := make(chan reply, 1)
	go func() { ch <- post(t, base, path, body, hdr...) }()
	return ch
}

func TestSGLangRendezvous(t *testing.T) {
	p, d := sglangPair(t, testParams())
	std := startPod(t, PodConfig{Engine: EngineSGLang})
	client := map[string]any{"model": testModel, "messages": []any{map[string]any{"role": "user", "content": "hi there"}}, "max_tokens": 4, "stream": true}
	pre, dec := sglangLegs(p, client, 7, "req-1-0000000100000001")

	// Prefill first: it waits at its bootstrap server until the decode joins.
	pc := postAsync(t, p.URL(), "/v1/chat/completions", mustJSON(t, pre))
	if _, err := p.WaitStats(testCtx(t), func(st Stats) bool { return st.PrefillBootstrap == 1 }); err != nil {
		t.Fatal(err)
	}
	if m := get(t, p.URL()+"/metrics"); !strings.Contains(string(m.body), `sglang:num_prefill_prealloc_queue_reqs{model_name="sim-model"} 1`) {
		t.Fatalf("metrics while the prefill waits:\n%s", m.body)
	}
	dr := post(t, d.URL(), "/v1/chat/completions", mustJSON(t, dec))
	mustStatus(t, dr, 200)
	mustStatus(t, <-pc, 200)
	plain := post(t, std.URL(), "/v1/chat/completions", mustJSON(t, client))
	if a, b := streamText(t, dr.body), streamText(t, plain.body); a != b {
		t.Fatalf("PD answer %q differs from the standard pod's %q", a, b)
	}

	// Decode first: it waits for the prefill.
	pre, dec = sglangLegs(p, client, 8, "req-2-0000000100000002")
	dc := postAsync(t, d.URL(), "/v1/chat/completions", mustJSON(t, dec))
	if _, err := d.WaitStats(testCtx(t), func(st Stats) bool { return st.DecodePrealloc == 1 }); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, post(t, p.URL(), "/v1/chat/completions", mustJSON(t, pre)), 200)
	mustStatus(t, <-dc, 200)
	if st := p.Stats(); st.KVUsedTokens != 0 {
		t.Fatalf("prefill pod still holds KV: %+v", st)
	}
}

func TestSGLangBootstrapTimeouts(t *testing.T) {
	p, d := sglangPair(t, shortBootstrap())
	client := map[string]any{"model": testModel, "prompt": "lonely", "max_tokens": 2}
	pre, dec := sglangLegs(p, client, 9, "r-9")
	r := post(t, p.URL(), "/v1/completions", mustJSON(t, pre))
	if r.status != 500 || !strings.Contains(string(r.body), "no decode leg joined") {
		t.Fatalf("prefill without decode: %d %s", r.status, r.body)
	}
	r = post(t, d.URL(), "/v1/completions", mustJSON(t, dec))
	if r.status != 500 || !strings.Contains(string(r.body), "no prefill leg delivered") {
		t.Fatalf("decode without prefill: %d %s", r.status, r.body)
	}
}

func TestSGLangAbortRequest(t *testing.T) {
	p, d := sglangPair(t, testParams())
	client := map[string]any{"model": testModel, "prompt": "abort me", "max_tokens": 2}
	_, dec := sglangLegs(p, client, 10, "gw-1-00000001deadbeef")
	dc := postAsync(t, d.URL(), "/v1/completions", mustJSON(t, dec))
	if _, err := d.WaitStats(testCtx(t), func(st Stats) bool { return st.DecodePrealloc == 1 }); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, post(t, d.URL(), "/abort_request", `{"rid":"gw-1"}`), 200) // a prefix matches
	r := <-dc
	if r.status != 500 || !strings.Contains(string(r.body), "aborted") {
		t.Fatalf("aborted decode: %d %s", r.status, r.body)
	}
	if got := d.Aborts(); len(got) != 1 || got[0] != "gw-1" {
		t.Fatalf("Aborts() = %v", got)
	}
	if _, err := d.WaitStats(testCtx(t), func(st Stats) bool { return st.DecodePrealloc == 0 }); err != nil {
		t.Fatal(err)
	}
	// A rid that matches nothing still answers 200; a body without rid is a 400.
	mustStatus(t, post(t, d.URL(), "/abort_request", `{"rid":"nobody"}`), 200)
	mustStatus(t, post(t, d.URL(), "/abort_request", `{"id":"x"}`), 400)

	// A running stream, hung after one token, ends with finish_reason "abort".
	std := startPod(t, PodConfig{Engine: EngineSGLang})
	ctx := testCtx(t)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, std.URL()+"/v1/completions",
		strings.NewReader(`{"model":"sim-model","prompt":"x","max_tokens":5,"stream":true,"rid":"run-1"}`))
	req.Header.Set(HeaderFault, "hang-after-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf) // the first token's chunk
	if !strings.Contains(string(buf[:n]), `"finish_reason":null`) {
		t.Fatalf("first chunk %q", buf[:n])
	}
	mustStatus(t, post(t, std.URL(), "/abort_request", `{"rid":"run-1"}`), 200)
	var rest strings.Builder
	for {
		n, err := resp.Body.Read(buf)
		rest.Write(buf[:n])
		if err != nil {
			break
		}
	}
	if !strings.Contains(rest.String(), `"finish_reason":"abort"`) || !strings.HasSuffix(rest.String(), "data: [DONE]\n\n") {
		t.Fatalf("after abort: %q", rest.String())
	}
}

func TestSGLangContractViolations(t *testing.T) {
	p, d := sglangPair(t, testParams())
	std := startPod(t, PodConfig{Engine: EngineSGLang})
	client := map[string]any{"model": testModel, "prompt": "same prompt", "max_tokens": 3}
	pre, dec := sglangLegs(p, client, 11, "r-11")
	edit := func(base map[string]any, f func(m map[string]any)) string {
		m := maps.Clone(base)
		f(m)
		return mustJSON(t, m)
	}
	for _, c := range []struct {
		name string
		pod  *Server
		body string
		want string
	}{
		{"prefill without rid", p, edit(pre, func(m map[string]any) { delete(m, "rid") }), "rid"},
		{"room as string", p, edit(pre, func(m map[string]any) { m["bootstrap_room"] = "11" }), "bootstrap_room"},
		{"room as float", p, edit(pre, func(m map[string]any) { m["bootstrap_room"] = 1.5 }), "bootstrap_room"},
		{"room negative", p, edit(pre, func(m map[string]any) { m["bootstrap_room"] = -1 }), "bootstrap_room"},
		{"port missing", p, edit(pre, func(m map[string]any) { delete(m, "bootstrap_port") }), "bootstrap_port"},
		{"host empty", p, edit(pre, func(m map[string]any) { m["bootstrap_host"] = "" }), "bootstrap_host"},
		{"port of another pod", p, edit(pre, func(m map[string]any) { m["bootstrap_port"] = d.BootstrapPort() }), "not this prefill pod"},
		{"prefill streams", p, edit(pre, func(m map[string]any) { m["stream"] = true }), "stream"},
		{"prefill max_tokens 3", p, edit(pre, func(m map[string]any) { m["max_tokens"] = 3 }), "max_tokens"},
		{"plain request to a prefill pod", p, mustJSON(t, client), "bootstrap_host, bootstrap_port and bootstrap_room"},
		{"plain request to a decode pod", d, mustJSON(t, client), "bootstrap_host, bootstrap_port and bootstrap_room"},
		{"bootstrap fields to a standard pod", std, mustJSON(t, dec), "standard pod"},
		{"decode to an unreachable bootstrap", d, edit(dec, func(m map[string]any) { m["bootstrap_port"] = 1 }), "cannot reach"},
	} {
		r := post(t, c.pod.URL(), "/v1/completions", c.body)
		if r.status != 400 || !strings.Contains(string(r.body), c.want) {
			t.Errorf("%s: %d %s, want 400 naming %q", c.name, r.status, r.body, c.want)
		}
	}
	// Different rids on the two legs fail both.
	dc := postAsync(t, d.URL(), "/v1/completions", edit(dec, func(m map[string]any) { m["rid"] = "r-other" }))
	if _, err := d.WaitStats(testCtx(t), func(st Stats) bool { return st.DecodePrealloc == 1 }); err != nil {
		t.Fatal(err)
	}
	pr := post(t, p.URL(), "/v1/completions", mustJSON(t, pre))
	dr := <-dc
	if pr.status != 400 || dr.status != 400 || !strings.Contains(string(dr.body), "rid") {
		t.Fatalf("rid mismatch: prefill %d %s / decode %d %s", pr.status, pr.body, dr.status, dr.body)
	}
}

// An SGLang decode leg of another KV format is refused at the prefill pod's bootstrap server:
// SGLang cannot fall back to a local prefill, so both legs fail.
func TestSGLangKVFormatSkew(t *testing.T) {
	p := startPod(t, PodConfig{Engine: EngineSGLang, Role: RolePrefill, KVFormat: "a"})
	d := startPod(t, PodConfig{Engine: EngineSGLang, Role: RoleDecode, KVFormat: "b"})
	client := map[string]any{"model": testModel, "messages": []any{map[string]any{"role": "user", "content": "skewed"}}, "max_tokens": 4}
	pre, dec := sglangLegs(p, client, 9, "req-9-0000000100000009")
	pc := postAsync(t, p.URL(), "/v1/chat/completions", mustJSON(t, pre))
	dr := post(t, d.URL(), "/v1/chat/completions", mustJSON(t, dec))
	pr := <-pc
	for name, r := range map[string]reply{"prefill": pr, "decode": dr} {
		if r.status != 500 || !strings.Contains(string(r.body), "KV format") {
			t.Fatalf("%s leg: %d %s, want 500 naming the KV format", name, r.status, r.body)
		}
	}
	if st := p.Stats(); st.KVUsedTokens != 0 || st.KVHeld != 0 {
		t.Fatalf("the prefill pod holds KV after a refused transfer: %+v", st)
	}
}
