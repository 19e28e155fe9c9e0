package handoffe2e

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/sim"
)

// variant is one engine's hand-off flavour and what its two legs must carry.
type variant struct {
	name   string
	engine string
	env    map[string]string // on top of eppEnv
	labels map[string]string // prefill pod labels
	// replaces names a client key the decode leg legitimately rewrites (TensorRT-LLM
	// context_first: a completion's prompt becomes the context's token ids).
	replaces string
	// check verifies the engine's own fields of the legs the pods received.
	check func(t *testing.T, st *stack, c clientCase, prefill, decode gjson.Result)
}

// eppEnv is Tandem's environment for the epp hand-off: token_load policies on both sides, so
// the tests also see the ledgers released.
func eppEnv(extra map[string]string) map[string]string {
	env := map[string]string{"TANDEM_PD_HANDOFF": "epp",
		"AIBRIX_PREFILL_SCORE_POLICY": "token_load", "AIBRIX_DECODE_SCORE_POLICY": "token_load"}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// clientCase is one client request.
type clientCase struct {
	chat, stream bool
}

func (c clientCase) path() string {
	if c.chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// body is the client's request: a 64-bit seed (must never be rounded through a float), a
// client max_tokens and, when streaming, stream_options — all must reach the decode pod as sent.
func (c clientCase) body() []byte {
	b := `{"model":"m","max_tokens":7,"seed":9007199254740993,"user":"u-1"`
	if c.chat {
		b += `,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell me about the sea \u00e9 and the ships"}]`
	} else {
		b += `,"prompt":"Tell me about the sea and the ships"`
	}
	if c.stream {
		b += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return []byte(b + `}`)
}

func (c clientCase) String() string {
	return map[bool]string{true: "chat", false: "completions"}[c.chat] + "/stream=" + strconv.FormatBool(c.stream)
}

var clientCases = []clientCase{{true, false}, {true, true}, {false, false}, {false, true}}

var variants = []variant{
	{name: "vllm-shfs", engine: sim.EngineVLLM, check: checkVLLMSHFS},
	{name: "vllm-nixl", engine: sim.EngineVLLM, env: map[string]string{"AIBRIX_KV_CONNECTOR_TYPE": "nixl"}, check: checkVLLMNIXL},
	{name: "vllm-nixl-by-label", engine: sim.EngineVLLM, labels: map[string]string{pool.LabelKVConnector: "nixl"}, check: checkVLLMNIXL},
	{name: "sglang", engine: sim.EngineSGLang, check: checkSGLang},
	{name: "trtllm-context-first", engine: sim.EngineTRTLLM, replaces: "prompt", check: checkTRTContextFirst},
	{name: "trtllm-generation-first", engine: sim.EngineTRTLLM, env: map[string]string{"AIBRIX_TRT_SCHEDULE_STYLE": "generation_first"},
		check: checkTRTGenerationFirst},
}

// TestEPPHandoffFlows sends each client request through the gateway to each engine's PD pair in
// epp mode and checks the exact bodies both legs received and the answer.
func TestEPPHandoffFlows(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			st := newStack(t, stackOptions{engine: v.engine, env: eppEnv(v.env), prefillLabels: v.labels})
			for _, c := range clientCases {
				t.Run(c.String(), func(t *testing.T) {
					st.prefill.ResetRequests()
					st.decode.ResetRequests()
					ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
					defer cancel()
					r := st.post(ctx, c.path(), c.body(), nil)
					if r.status != 200 || r.readErr != nil {
						t.Fatalf("status %d, read error %v: %s", r.status, r.readErr, r.body)
					}
					if got := r.header.Get("X-Sim-Pod"); got != st.decode.Config().Name {
						t.Errorf("answered by %q, want the decode pod %q", got, st.decode.Config().Name)
					}
					if c.stream != strings.HasPrefix(string(r.body), "data:") {
						t.Errorf("stream=%v but the answer is %.60q", c.stream, r.body)
					}
					if r.text() == "" {
						t.Errorf("empty answer: %s", r.body)
					}
					pre, dec := inferences(st.prefill), inferences(st.decode)
					if len(pre) != 1 || len(dec) != 1 {
						t.Fatalf("prefill pod got %d inference requests, decode pod %d; want 1 each", len(pre), len(dec))
					}
					if h := dec[0].Header.Get(sim.HeaderPrefiller); h != "" {
						t.Errorf("decode leg carries %s=%q in epp mode: the decode pod would prefill again", sim.HeaderPrefiller, h)
					}
					checkCommon(t, c, v.replaces, pre[0].Body, dec[0].Body)
					v.check(t, st, c, gjson.ParseBytes(pre[0].Body), gjson.ParseBytes(dec[0].Body))
				})
			}
			// The token_load policies charged their ledgers (so the release check at the end
			// of the test has something to check).
			for _, g := range []string{"pd_token_load_active_tokens", "pd_token_load_decode_tokens"} {
				if st.series(g) == 0 {
					t.Errorf("%s has no series: the token-load ledgers were never charged", g)
				}
			}
			want := float64(len(clientCases))
			if !eventually(func() bool { return st.counter("gateway_prefill_request_success_total", nil) == want }) {
				t.Errorf("gateway_prefill_request_success_total = %v, want %v", st.counter("gateway_prefill_request_success_total", nil), want)
			}
		})
	}
}

// prefillOverrides are the keys the prefill leg sets or removes for every engine.
var prefillOverrides = map[string]bool{"max_tokens": true, "max_completion_tokens": true, "stream": true,
	"stream_options": true, "min_tokens": true}

// checkCommon: the prefill leg is the client's request made one-token and non-streaming; the
// decode leg keeps every client key byte for byte.
func checkCommon(t *testing.T, c clientCase, replaces string, prefill, decode []byte) {
	t.Helper()
	client := gjson.ParseBytes(c.body())
	p, d := gjson.ParseBytes(prefill), gjson.ParseBytes(decode)
	if !gjson.ValidBytes(prefill) || !gjson.ValidBytes(decode) {
		t.Fatalf("invalid JSON: prefill %s decode %s", prefill, decode)
	}
	if got := p.Get("max_tokens").Raw; got != "1" {
		t.Errorf("prefill max_tokens = %s, want 1", got)
	}
	if got := p.Get("stream").Raw; got != "false" {
		t.Errorf("prefill stream = %s, want false", got)
	}
	for _, k := range []string{"stream_options", "min_tokens"} {
		if p.Get(k).Exists() {
			t.Errorf("prefill leg keeps %s: %s", k, p.Get(k).Raw)
		}
	}
	client.ForEach(func(k, v gjson.Result) bool {
		if got := d.Get(k.Str).Raw; got != v.Raw && k.Str != replaces {
			t.Errorf("decode %s = %s, want the client's %s", k.Str, got, v.Raw)
		}
		if !prefillOverrides[k.Str] {
			if got := p.Get(k.Str).Raw; got != v.Raw {
				t.Errorf("prefill %s = %s, want the client's %s", k.Str, got, v.Raw)
			}
		}
		return true
	})
}

func checkVLLMSHFS(t *testing.T, st *stack, _ clientCase, p, d gjson.Result) {
	t.Helper()
	want := map[string]string{"do_remote_decode": "true", "do_remote_prefill": "false", "remote_engine_id": "null",
		"remote_block_ids": "null", "remote_host": "null", "remote_port": "null"}
	checkObject(t, "prefill kv_transfer_params", p.Get("kv_transfer_params"), want)
	if got := p.Get("max_completion_tokens").Raw; got != "1" {
		t.Errorf("prefill max_completion_tokens = %s, want 1", got)
	}
	kv := d.Get("kv_transfer_params")
	_, kvPort, _ := strings.Cut(st.prefill.KVHostPort(), ":")
	if kv.Get("do_remote_prefill").Raw != "true" || kv.Get("do_remote_decode").Raw != "false" ||
		kv.Get("remote_engine_id").Str != st.prefill.EngineID() || kv.Get("remote_host").Str != "127.0.0.1" ||
		kv.Get("remote_port").Raw != kvPort || len(kv.Get("remote_block_ids").Array()) == 0 {
		t.Errorf("decode kv_transfer_params %s: want the prefill pod's (engine %s, host 127.0.0.1, port %s)", kv.Raw, st.prefill.EngineID(), kvPort)
	}
	if d.Get("disagg_prefill_resp").Exists() {
		t.Error("shfs decode leg carries disagg_prefill_resp")
	}
}

func checkVLLMNIXL(t *testing.T, st *stack, _ clientCase, p, d gjson.Result) {
	t.Helper()
	if p.Get("kv_transfer_params").Exists() {
		t.Errorf("nixl prefill leg carries kv_transfer_params %s", p.Get("kv_transfer_params").Raw)
	}
	if got := p.Get("max_completion_tokens").Raw; got != "1" {
		t.Errorf("prefill max_completion_tokens = %s, want 1", got)
	}
	resp := d.Get("disagg_prefill_resp")
	if !resp.IsObject() || resp.Get("kv_transfer_params.remote_engine_id").Str != st.prefill.EngineID() || len(resp.Get("choices").Array()) == 0 {
		t.Errorf("decode disagg_prefill_resp %s: want the prefill pod's whole answer", resp.Raw)
	}
	if d.Get("kv_transfer_params").Exists() {
		t.Errorf("nixl decode leg carries kv_transfer_params %s", d.Get("kv_transfer_params").Raw)
	}
}

func checkSGLang(t *testing.T, st *stack, _ clientCase, p, d gjson.Result) {
	t.Helper()
	port := strconv.Itoa(st.prefill.BootstrapPort())
	for leg, r := range map[string]gjson.Result{"prefill": p, "decode": d} {
		if r.Get("bootstrap_host").Str != "127.0.0.1" || r.Get("bootstrap_port").Raw != port {
			t.Errorf("%s bootstrap %s:%s, want 127.0.0.1:%s", leg, r.Get("bootstrap_host").Raw, r.Get("bootstrap_port").Raw, port)
		}
		if r.Get("bootstrap_room").Type != gjson.Number || r.Get("rid").Str == "" {
			t.Errorf("%s bootstrap_room %s rid %s", leg, r.Get("bootstrap_room").Raw, r.Get("rid").Raw)
		}
	}
	if p.Get("bootstrap_room").Raw != d.Get("bootstrap_room").Raw || p.Get("rid").Str != d.Get("rid").Str {
		t.Errorf("legs disagree: room %s/%s rid %s/%s", p.Get("bootstrap_room").Raw, d.Get("bootstrap_room").Raw, p.Get("rid").Str, d.Get("rid").Str)
	}
}

func checkTRTContextFirst(t *testing.T, _ *stack, c clientCase, p, d gjson.Result) {
	t.Helper()
	pp := p.Get("disaggregated_params")
	if pp.Get("request_type").Str != "context_only" || !bigID(pp.Get("disagg_request_id")) || pp.Get("schedule_style").Exists() {
		t.Errorf("prefill disaggregated_params %s", pp.Raw)
	}
	if p.Get("max_completion_tokens").Exists() {
		t.Errorf("context leg keeps max_completion_tokens %s", p.Get("max_completion_tokens").Raw)
	}
	dp := d.Get("disaggregated_params")
	if dp.Get("request_type").Str != "generation_only" || dp.Get("ctx_request_id").Raw != pp.Get("disagg_request_id").Raw ||
		dp.Get("encoded_opaque_state").Str == "" || len(dp.Get("first_gen_tokens").Array()) != 1 {
		t.Errorf("decode disaggregated_params %s (context id %s)", dp.Raw, pp.Get("disagg_request_id").Raw)
	}
	ids := d.Get("prompt_token_ids")
	if !c.chat {
		ids = d.Get("prompt")
	}
	if !ids.IsArray() || len(ids.Array()) == 0 {
		t.Errorf("decode leg lacks the context's prompt token ids: %s", ids.Raw)
	}
}

func checkTRTGenerationFirst(t *testing.T, _ *stack, _ clientCase, p, d gjson.Result) {
	t.Helper()
	pp, dp := p.Get("disaggregated_params"), d.Get("disaggregated_params")
	if pp.Get("request_type").Str != "context_only" || pp.Get("schedule_style").Raw != "1" || !bigID(pp.Get("disagg_request_id")) {
		t.Errorf("prefill disaggregated_params %s", pp.Raw)
	}
	if dp.Get("request_type").Str != "generation_only" || dp.Get("schedule_style").Raw != "1" ||
		dp.Get("disagg_request_id").Raw != pp.Get("disagg_request_id").Raw || !dp.Get("ctx_info_endpoint").Exists() ||
		dp.Get("ctx_dp_rank").Raw != "0" {
		t.Errorf("decode disaggregated_params %s (context %s)", dp.Raw, pp.Raw)
	}
}

// bigID says the id is a Snowflake id (≥ 2^42) written as an integer.
func bigID(r gjson.Result) bool {
	n, err := strconv.ParseUint(r.Raw, 10, 64)
	return err == nil && n >= 1<<42
}

func checkObject(t *testing.T, what string, obj gjson.Result, want map[string]string) {
	t.Helper()
	n := 0
	obj.ForEach(func(k, v gjson.Result) bool {
		n++
		if w, ok := want[k.Str]; !ok || v.Raw != w {
			t.Errorf("%s.%s = %s, want %q", what, k.Str, v.Raw, w)
		}
		return true
	})
	if n != len(want) {
		t.Errorf("%s = %s, want exactly the keys %v", what, obj.Raw, want)
	}
}
