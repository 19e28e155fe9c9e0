package handoffe2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/sim"
)

// apiCase is one client request of an API beyond plain-text chat and completions.
type apiCase struct {
	name, path string
	body       string
	stream     bool
	// limit is the output-limit key the prefill leg sets to 1; extra are other keys it must
	// set (Responses: neither stored nor in the background).
	limit string
	extra map[string]string
}

var apiCases = []apiCase{
	{name: "messages", path: "/v1/messages", limit: "max_tokens",
		body: `{"model":"m","max_tokens":6,"system":"Be brief.","messages":[{"role":"user","content":[{"type":"text","text":"Tell me about the sea"}]}]}`},
	{name: "messages-stream", path: "/v1/messages", limit: "max_tokens", stream: true,
		body: `{"model":"m","max_tokens":6,"stream":true,"messages":[{"role":"user","content":"Tell me about the ships"}]}`},
	{name: "responses", path: "/v1/responses", limit: "max_output_tokens", extra: map[string]string{"store": "false", "background": "false"},
		body: `{"model":"m","max_output_tokens":6,"instructions":"Be kind.","input":[{"role":"user","content":[{"type":"input_text","text":"Tell me about the sea"}]}]}`},
	{name: "responses-stream", path: "/v1/responses", limit: "max_output_tokens", stream: true, extra: map[string]string{"store": "false", "background": "false"},
		body: `{"model":"m","max_output_tokens":6,"stream":true,"input":"Tell me about the ships"}`},
	{name: "completions-token-ids", path: "/v1/completions", limit: "max_tokens",
		body: `{"model":"m","max_tokens":6,"prompt":[1820,3495,315,279,9581,323,279,18198]}`},
	{name: "chat-content-parts", path: "/v1/chat/completions", limit: "max_tokens", stream: true,
		body: `{"model":"m","max_tokens":6,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"Tell me"},{"type":"text","text":" about the sea"}]}]}`},
}

// onSGLang says whether SGLang's hand-off carries the API: its /v1/messages drops the bootstrap
// fields, and Tandem hands off only chat and completions there.
func (c apiCase) onSGLang() bool {
	return !strings.HasPrefix(c.path, "/v1/messages") && c.path != "/v1/responses"
}

// One request of each API through the gateway, Tandem's ext_proc stream and a simulated vLLM
// and SGLang PD pair: disaggregated where the engine's server carries the hand-off, refused
// with a 400 that says why where it does not, and never silently sent to one pod.
func TestEPPHandoffAPIs(t *testing.T) {
	for _, engine := range []string{sim.EngineVLLM, sim.EngineSGLang} {
		t.Run(engine, func(t *testing.T) {
			st := newStack(t, stackOptions{engine: engine, env: eppEnv(nil)})
			for _, c := range apiCases {
				t.Run(c.name, func(t *testing.T) {
					st.prefill.ResetRequests()
					st.decode.ResetRequests()
					ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
					defer cancel()
					r := st.post(ctx, c.path, []byte(c.body), nil)
					pre, dec := inferences(st.prefill), inferences(st.decode)
					if engine == sim.EngineSGLang && !c.onSGLang() {
						if r.status != 400 || !strings.Contains(string(r.body), "cannot be split into prefill and decode on sglang pods") {
							t.Fatalf("status %d: %s; want a 400 refusing the split", r.status, r.body)
						}
						if len(pre)+len(dec) != 0 {
							t.Fatalf("a refused request reached the pods (%d prefill, %d decode)", len(pre), len(dec))
						}
						return
					}
					if r.status != 200 || r.readErr != nil {
						t.Fatalf("status %d, read error %v: %s", r.status, r.readErr, r.body)
					}
					if got := r.header.Get("X-Sim-Pod"); got != st.decode.Config().Name {
						t.Errorf("answered by %q, want the decode pod %q", got, st.decode.Config().Name)
					}
					if r.text() == "" || c.stream != strings.Contains(string(r.body), "data: ") {
						t.Errorf("stream=%v, answer %.200s", c.stream, r.body)
					}
					if len(pre) != 1 || len(dec) != 1 || pre[0].Path != c.path || dec[0].Path != c.path {
						t.Fatalf("prefill pod got %d requests, decode pod %d; want 1 each, on %s", len(pre), len(dec), c.path)
					}
					p, d := gjson.ParseBytes(pre[0].Body), gjson.ParseBytes(dec[0].Body)
					want := map[string]string{c.limit: "1", "stream": "false"}
					for k, v := range c.extra {
						want[k] = v
					}
					for k, v := range want {
						if got := p.Get(k).Raw; got != v {
							t.Errorf("prefill %s = %s, want %s", k, got, v)
						}
					}
					gjson.Parse(c.body).ForEach(func(k, v gjson.Result) bool {
						if got := d.Get(k.Str).Raw; got != v.Raw {
							t.Errorf("decode %s = %s, want the client's %s", k.Str, got, v.Raw)
						}
						if _, set := want[k.Str]; !set && p.Get(k.Str).Raw != v.Raw {
							t.Errorf("prefill %s = %s, want the client's %s", k.Str, p.Get(k.Str).Raw, v.Raw)
						}
						return true
					})
					switch {
					case engine == sim.EngineVLLM && c.limit == "max_tokens" && c.path != "/v1/messages":
						checkVLLMSHFS(t, st, clientCase{}, p, d)
					case engine == sim.EngineVLLM:
						checkVLLMKV(t, st, p, d)
					default:
						checkSGLang(t, st, clientCase{}, p, d)
					}
				})
			}
		})
	}
}

// Combinations the hand-off refuses: AIBrix's nixl contract on Messages, and a Responses request
// that continues a stored response (the prefill pod has none).
func TestEPPHandoffRefusals(t *testing.T) {
	st := newStack(t, stackOptions{engine: sim.EngineVLLM, env: eppEnv(map[string]string{"AIBRIX_KV_CONNECTOR_TYPE": "nixl"})})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for _, c := range []struct{ path, body, param, msg string }{
		{"/v1/messages", apiCases[0].body, "", "cannot be split into prefill and decode on vllm/nixl pods"},
		{"/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_1"}`, "previous_response_id", "no stored response"},
		{"/v1/messages", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens", "a positive integer"},
		{"/v1/responses", `{"model":"m","input":7}`, "input", "a number"},
	} {
		r := st.post(ctx, c.path, []byte(c.body), nil)
		want := fmt.Sprintf(`"param":%q`, c.param)
		if c.param == "" {
			want = `"param":null`
		}
		if r.status != 400 || !strings.Contains(string(r.body), c.msg) || !strings.Contains(string(r.body), want) {
			t.Errorf("%s %s: %d %s; want a 400 naming %q with %q", c.path, c.body, r.status, r.body, c.param, c.msg)
		}
	}
	if n := len(inferences(st.prefill)) + len(inferences(st.decode)); n != 0 {
		t.Errorf("refused requests reached the pods: %d", n)
	}
}

// checkVLLMKV checks the kv_transfer_params round trip of a Messages or Responses hand-off: the
// prefill leg asks for a remote decode, the decode leg carries the prefill pod's answer, and no
// chat-only key (max_completion_tokens) was added to either.
func checkVLLMKV(t *testing.T, st *stack, p, d gjson.Result) {
	t.Helper()
	checkObject(t, "prefill kv_transfer_params", p.Get("kv_transfer_params"), map[string]string{"do_remote_decode": "true",
		"do_remote_prefill": "false", "remote_engine_id": "null", "remote_block_ids": "null", "remote_host": "null", "remote_port": "null"})
	kv := d.Get("kv_transfer_params")
	if kv.Get("do_remote_prefill").Raw != "true" || kv.Get("remote_engine_id").Str != st.prefill.EngineID() || len(kv.Get("remote_block_ids").Array()) == 0 {
		t.Errorf("decode kv_transfer_params %s: want the prefill pod's (engine %s)", kv.Raw, st.prefill.EngineID())
	}
	for _, k := range []string{"max_completion_tokens", "stream_options"} {
		if p.Get(k).Exists() || d.Get(k).Exists() {
			t.Errorf("a leg carries %s, which the API does not have", k)
		}
	}
}
