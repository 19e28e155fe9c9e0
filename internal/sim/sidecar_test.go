package sim

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRoutingSidecar(t *testing.T) {
	p := startPod(t, PodConfig{Engine: EngineVLLM, Role: RolePrefill})
	d := startPod(t, PodConfig{Engine: EngineVLLM, Role: RoleDecode, RoutingSidecar: true})
	client := `{"model":"sim-model","prompt":"route me through the sidecar","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`
	r := post(t, d.URL(), "/v1/completions", client, HeaderPrefiller, p.HostPort()+", 127.0.0.1:1")
	mustStatus(t, r, 200)

	pre := p.Requests()
	if len(pre) != 1 {
		t.Fatalf("prefill pod got %d requests", len(pre))
	}
	var pb map[string]any
	_ = json.Unmarshal(pre[0].Body, &pb)
	kv, _ := pb["kv_transfer_params"].(map[string]any)
	if kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false || pb["stream"] != false || pb["max_tokens"] != 1.0 ||
		pb["max_completion_tokens"] != 1.0 || pb["stream_options"] != nil || pre[0].Header.Get("X-Request-Id") == "" {
		t.Fatalf("sidecar prefill leg %s %v", pre[0].Body, pre[0].Header)
	}
	recs := d.Requests()
	if len(recs) != 2 || recs[1].Header.Get(HeaderSidecarLeg) != "decode" {
		t.Fatalf("decode pod records %+v", recs)
	}
	var db map[string]any
	_ = json.Unmarshal(recs[1].Body, &db)
	dkv, _ := db["kv_transfer_params"].(map[string]any)
	if dkv["do_remote_prefill"] != true || db["stream"] != true || db["max_tokens"] != 4.0 || db["stream_options"] == nil || db["max_completion_tokens"] != nil {
		t.Fatalf("sidecar decode leg %s", recs[1].Body)
	}
	// Same answer as without the sidecar.
	plain := post(t, d.URL(), "/v1/completions", client)
	if a, b := streamText(t, r.body), streamText(t, plain.body); a != b || a == "" {
		t.Fatalf("sidecar answer %q, plain %q", a, b)
	}
}

func TestRoutingSidecarPrefillErrors(t *testing.T) {
	p := startPod(t, PodConfig{Engine: EngineVLLM, Role: RolePrefill})
	d := startPod(t, PodConfig{Engine: EngineVLLM, Role: RoleDecode, RoutingSidecar: true})
	client := `{"model":"sim-model","prompt":"x","max_tokens":2}`
	// 5xx: decode the original request locally.
	mustStatus(t, post(t, d.URL(), "/v1/completions", client, HeaderPrefiller, p.HostPort(), HeaderFault, "prefill-500"), 200)
	if recs := d.Requests(); recs[len(recs)-1].Header.Get(HeaderSidecarLeg) != "fallback" || strings.Contains(recs[len(recs)-1].Text, "kv_transfer_params") {
		t.Fatalf("fallback leg %+v", recs[len(recs)-1])
	}
	// Unreachable prefill pod: the same fallback.
	mustStatus(t, post(t, d.URL(), "/v1/completions", client, HeaderPrefiller, "127.0.0.1:1"), 200)
	// 4xx: passed back to the client.
	r := post(t, d.URL(), "/v1/completions", client, HeaderPrefiller, p.HostPort(), HeaderFault, "prefill-429")
	if r.status != 429 || !strings.Contains(string(r.body), "simulated fault") {
		t.Fatalf("4xx from the prefill pod: %d %s", r.status, r.body)
	}
}
