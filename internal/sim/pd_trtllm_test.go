package sim

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
)

// bigID is above 2^53, so a float64 round trip would change it.
const bigID = int64(1)<<62 + 12345

func trtPair(t *testing.T, cfg PodConfig) (ctxW, genW *Server) {
	cfg.Engine = EngineTRTLLM
	c, g := cfg, cfg
	c.Role, g.Role = RolePrefill, RoleDecode
	return startPod(t, c), startPod(t, g)
}

func trtContextBody(client map[string]any, id any, extra ...any) map[string]any {
	m := maps.Clone(client)
	dp := map[string]any{"request_type": "context_only", "disagg_request_id": id}
	for i := 0; i+1 < len(extra); i += 2 {
		dp[extra[i].(string)] = extra[i+1]
	}
	m["disaggregated_params"] = dp
	m["max_tokens"], m["stream"] = 1, false
	delete(m, "max_completion_tokens")
	delete(m, "stream_options")
	return m
}

// mergeContext does what AIBrix's MergePrefillResponse does for context_first.
func mergeContext(t *testing.T, client map[string]any, resp reply, chat bool) map[string]any {
	t.Helper()
	a := resp.json(t)
	dp, _ := a["disaggregated_params"].(map[string]any)
	if dp == nil {
		dp, _ = a["choices"].([]any)[0].(map[string]any)["disaggregated_params"].(map[string]any)
	}
	if dp == nil {
		t.Fatalf("no disaggregated_params in %s", resp.body)
	}
	dp = maps.Clone(dp)
	dp["request_type"] = "generation_only"
	m := maps.Clone(client)
	m["disaggregated_params"] = dp
	if chat {
		m["prompt_token_ids"] = a["prompt_token_ids"]
	} else {
		m["prompt"] = a["prompt_token_ids"]
	}
	return m
}

func TestTRTContextFirst(t *testing.T) {
	for _, top := range []bool{false, true} {
		ctxW, genW := trtPair(t, PodConfig{TRTParamsTopLevel: top})
		client := map[string]any{"model": testModel, "messages": []any{map[string]any{"role": "user", "content": "context first please"}},
			"max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true}}
		cr := post(t, ctxW.URL(), "/v1/chat/completions", mustJSON(t, trtContextBody(client, bigID)))
		mustStatus(t, cr, 200)
		// The id comes back as the exact integer literal, never through a float.
		if want := `"disagg_request_id":4611686018427400249`; !strings.Contains(string(cr.body), want) || !strings.Contains(string(cr.body), `"ctx_request_id":4611686018427400249`) {
			t.Fatalf("context answer lacks %s: %s", want, cr.body)
		}
		a := cr.json(t)
		where := a
		if !top {
			where = a["choices"].([]any)[0].(map[string]any)
		}
		dp := where["disaggregated_params"].(map[string]any)
		if dp["request_type"] != "context_only" || dp["encoded_opaque_state"] == "" || len(dp["first_gen_tokens"].([]any)) != 1 {
			t.Fatalf("context disaggregated_params %v", dp)
		}
		if ids, _ := a["prompt_token_ids"].([]any); len(ids) != 7 { // "user\ncontext first please\n" = 26 bytes = 7 tokens
			t.Fatalf("prompt_token_ids %v", a["prompt_token_ids"])
		}
		gr := post(t, genW.URL(), "/v1/chat/completions", mustJSON(t, mergeContext(t, client, cr, true)))
		mustStatus(t, gr, 200)
		if got := len(strings.Fields(streamText(t, gr.body))); got != 4 {
			t.Fatalf("generation streamed %d tokens: %s", got, gr.body)
		}
		if st := ctxW.Stats(); st.KVUsedTokens != 0 {
			t.Fatalf("context worker still holds KV: %+v", st)
		}
	}
	// Completions: prompt_token_ids go into "prompt".
	ctxW, genW := trtPair(t, PodConfig{})
	client := map[string]any{"model": testModel, "prompt": "a completion prompt", "max_tokens": 2}
	cr := post(t, ctxW.URL(), "/v1/completions", mustJSON(t, trtContextBody(client, bigID+1)))
	mustStatus(t, cr, 200)
	mustStatus(t, post(t, genW.URL(), "/v1/completions", mustJSON(t, mergeContext(t, client, cr, false))), 200)
}

func TestTRTGenerationFirst(t *testing.T) {
	ctxW, genW := trtPair(t, PodConfig{})
	info := get(t, ctxW.URL()+"/server_info")
	var si struct {
		DP struct {
			Endpoint string `json:"ctx_info_endpoint"`
			Rank     *int   `json:"ctx_dp_rank"`
		} `json:"disaggregated_params"`
	}
	if err := json.Unmarshal(info.body, &si); err != nil || si.DP.Endpoint != "tcp://"+ctxW.KVHostPort() || si.DP.Rank == nil || *si.DP.Rank != 0 {
		t.Fatalf("/server_info = %s (%v)", info.body, err)
	}
	client := map[string]any{"model": testModel, "prompt": "generation goes first", "max_tokens": 3, "stream": true}
	gen := maps.Clone(client)
	gen["disaggregated_params"] = map[string]any{"request_type": "generation_only", "disagg_request_id": bigID, "ctx_request_id": bigID,
		"ctx_info_endpoint": si.DP.Endpoint, "ctx_dp_rank": 0, "schedule_style": 1}
	gc := postAsync(t, genW.URL(), "/v1/completions", mustJSON(t, gen))
	if _, err := genW.WaitStats(testCtx(t), func(st Stats) bool { return st.DecodePrealloc == 1 }); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, post(t, ctxW.URL(), "/v1/completions", mustJSON(t, trtContextBody(client, bigID, "schedule_style", 1))), 200)
	mustStatus(t, <-gc, 200)

	// A generation leg whose context never comes times out.
	ctxShort, genShort := trtPair(t, PodConfig{Params: shortBootstrap()})
	gen["disaggregated_params"].(map[string]any)["ctx_info_endpoint"] = "tcp://" + ctxShort.KVHostPort()
	if r := post(t, genShort.URL(), "/v1/completions", mustJSON(t, gen)); r.status != 500 || !strings.Contains(string(r.body), "no context leg arrived") {
		t.Fatalf("lonely generation leg: %d %s", r.status, r.body)
	}

	// /server_info is configurable, including empty.
	for _, raw := range []string{`{}`, `{"disaggregated_params":{}}`} {
		if err := ctxW.SetTRTServerInfo(raw); err != nil {
			t.Fatal(err)
		}
		if r := get(t, ctxW.URL()+"/server_info"); string(r.body) != raw {
			t.Fatalf("/server_info = %s, want %s", r.body, raw)
		}
	}
	mustStatus(t, post(t, ctxW.URL(), "/sim/server_info", ""), 204)
	if r := get(t, ctxW.URL()+"/server_info"); !strings.Contains(string(r.body), "ctx_info_endpoint") {
		t.Fatalf("default /server_info not restored: %s", r.body)
	}
}

func TestTRTContractViolations(t *testing.T) {
	ctxW, genW := trtPair(t, PodConfig{})
	client := map[string]any{"model": testModel, "prompt": "the prompt", "max_tokens": 3}
	cr := post(t, ctxW.URL(), "/v1/completions", mustJSON(t, trtContextBody(client, bigID)))
	mustStatus(t, cr, 200)
	good := mergeContext(t, client, cr, false)
	edit := func(f func(m, dp map[string]any)) string {
		m := maps.Clone(good)
		dp := maps.Clone(m["disaggregated_params"].(map[string]any))
		m["disaggregated_params"] = dp
		f(m, dp)
		return mustJSON(t, m)
	}
	ctxBody := func(f func(m, dp map[string]any)) string {
		m := trtContextBody(client, bigID+100)
		f(m, m["disaggregated_params"].(map[string]any))
		return mustJSON(t, m)
	}
	for _, c := range []struct {
		name string
		pod  *Server
		body string
		want string
	}{
		{"id below 2^42", ctxW, ctxBody(func(_, dp map[string]any) { dp["disagg_request_id"] = 12345 }), "2^42"},
		{"id as float literal", ctxW, strings.Replace(ctxBody(func(_, _ map[string]any) {}), "4611686018427400349", "4.611686018427400349e18", 1), "disagg_request_id"},
		{"id as string", ctxW, ctxBody(func(_, dp map[string]any) { dp["disagg_request_id"] = "4611686018427400349" }), "disagg_request_id"},
		{"unknown request_type", ctxW, ctxBody(func(_, dp map[string]any) { dp["request_type"] = "context_and_generation" }), "request_type"},
		{"context streams", ctxW, ctxBody(func(m, _ map[string]any) { m["stream"] = true }), "stream"},
		{"context max_tokens 3", ctxW, ctxBody(func(m, _ map[string]any) { m["max_tokens"] = 3 }), "max_tokens"},
		{"context carries first_gen_tokens", ctxW, ctxBody(func(_, dp map[string]any) { dp["first_gen_tokens"] = []int{1} }), "first_gen_tokens"},
		{"schedule_style 2", ctxW, ctxBody(func(_, dp map[string]any) { dp["schedule_style"] = 2 }), "schedule_style"},
		{"params not an object", ctxW, ctxBody(func(m, _ map[string]any) { m["disaggregated_params"] = []int{1} }), "must be an object"},
		{"plain request to a context worker", ctxW, mustJSON(t, client), "needs disaggregated_params"},
		{"plain request to a generation worker", genW, mustJSON(t, client), "needs disaggregated_params"},
		{"context leg to a generation worker", genW, ctxBody(func(_, _ map[string]any) {}), "role is decode"},
		{"generation leg to a context worker", ctxW, edit(func(_, _ map[string]any) {}), "role is prefill"},
		{"opaque state missing", genW, edit(func(_, dp map[string]any) { delete(dp, "encoded_opaque_state") }), "encoded_opaque_state"},
		{"opaque state garbage", genW, edit(func(_, dp map[string]any) { dp["encoded_opaque_state"] = "!!" }), "encoded_opaque_state"},
		{"ctx_request_id differs", genW, edit(func(_, dp map[string]any) { dp["ctx_request_id"] = bigID + 1 }), "ctx_request_id"},
		{"id differs from the opaque state", genW, edit(func(_, dp map[string]any) { dp["disagg_request_id"], dp["ctx_request_id"] = bigID+1, bigID+1 }), "belongs to request"},
		{"first_gen_tokens missing", genW, edit(func(_, dp map[string]any) { delete(dp, "first_gen_tokens") }), "first_gen_tokens"},
		{"generation_first without ctx_info_endpoint", genW, edit(func(_, dp map[string]any) { dp["schedule_style"] = 1 }), "ctx_info_endpoint"},
		{"generation_first with two endpoints", genW, edit(func(_, dp map[string]any) {
			dp["schedule_style"], dp["ctx_info_endpoint"], dp["ctx_dp_rank"] = 1, []string{"tcp://a:1", "tcp://b:2"}, 0
		}), "one endpoint"},
		{"generation_first without ctx_dp_rank", genW, edit(func(_, dp map[string]any) {
			dp["schedule_style"], dp["ctx_info_endpoint"] = 1, "tcp://"+ctxW.KVHostPort()
		}), "ctx_dp_rank"},
		{"generation_first with rank 1", genW, edit(func(_, dp map[string]any) {
			dp["schedule_style"], dp["ctx_info_endpoint"], dp["ctx_dp_rank"] = 1, []string{"tcp://" + ctxW.KVHostPort()}, 1
		}), "ctx_dp_rank"},
		{"first_gen_tokens altered", genW, edit(func(_, dp map[string]any) { dp["first_gen_tokens"] = []int{1} }), "first_gen_tokens"},
	} {
		r := post(t, c.pod.URL(), "/v1/completions", c.body)
		if r.status != 400 || !strings.Contains(string(r.body), c.want) {
			t.Errorf("%s: %d %s, want 400 naming %q", c.name, r.status, r.body, c.want)
		}
	}
	// "first_gen_tokens altered" consumed the context; a fresh one with another prompt fails on the prompt.
	cr = post(t, ctxW.URL(), "/v1/completions", mustJSON(t, trtContextBody(client, bigID+2)))
	mustStatus(t, cr, 200)
	m := mergeContext(t, client, cr, false)
	m["prompt"] = "a different prompt"
	if r := post(t, genW.URL(), "/v1/completions", mustJSON(t, m)); r.status != 400 || !strings.Contains(string(r.body), "prompt differs") {
		t.Fatalf("prompt mismatch: %d %s", r.status, r.body)
	}
	// Ids are unique per context worker.
	mustStatus(t, post(t, ctxW.URL(), "/v1/completions", mustJSON(t, trtContextBody(client, bigID+3))), 200)
	if r := post(t, ctxW.URL(), "/v1/completions", mustJSON(t, trtContextBody(client, bigID+3))); r.status != 400 || !strings.Contains(string(r.body), "already has a context") {
		t.Fatalf("duplicate id: %d %s", r.status, r.body)
	}
}
