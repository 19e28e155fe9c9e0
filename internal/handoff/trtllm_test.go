package handoff

import (
	"context"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/handoff/trt"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// fixedIDs issues ids at 2023-01-01T00:00:01Z for machine 5: (1000<<22 | 5<<12 | seq) + 2^42
// = 4402240835584 + seq.
func fixedIDs(t *testing.T) *trt.IDs { return fixedIDsB(t) }

func fixedIDsB(tb testing.TB) *trt.IDs {
	tb.Helper()
	ids, err := trt.NewIDs(5, func() time.Time { return time.UnixMilli(trt.Epoch + 1000) })
	if err != nil {
		tb.Fatal(err)
	}
	return ids
}

func TestTRTContextFirstPrepare(t *testing.T) {
	cases := []struct{ name, body, want string }{
		{
			name: "chat: context_only with the id; max_completion_tokens and stream_options deleted",
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":64,"stream":true,"stream_options":{"include_usage":true},"seed":9007199254740993}`,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false,"seed":9007199254740993,` +
				`"disaggregated_params":{"request_type":"context_only","disagg_request_id":4402240835584},"max_tokens":1}`,
		},
		{
			name: "completions with max_tokens",
			body: `{"model":"m","prompt":"once","max_tokens":30}`,
			want: `{"model":"m","prompt":"once","max_tokens":1,"disaggregated_params":{"request_type":"context_only","disagg_request_id":4402240835584},"stream":false}`,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := &TRTContextFirst{IDs: fixedIDs(t)}
			plan, err := e.Prepare(context.Background(), &Leg{Body: []byte(c.body)})
			if err != nil {
				t.Fatal(err)
			}
			if string(plan.PrefillBody) != c.want {
				t.Errorf("context body\n got %s\nwant %s", plan.PrefillBody, c.want)
			}
			if plan.Async || string(plan.DecodeBody) != c.body {
				t.Errorf("plan = %+v", plan)
			}
		})
	}
}

func TestTRTContextFirstMerge(t *testing.T) {
	// disagg_request_id 2^62+1 and a token id above 2^53: a float64 round trip would change both.
	const dp = `{"request_type":"context_only","first_gen_tokens":[42],"ctx_request_id":4611686018427387905,"disagg_request_id":4611686018427387905,"encoded_opaque_state":"b3BhcXVl"}`
	const genDP = `{"request_type":"generation_only","first_gen_tokens":[42],"ctx_request_id":4611686018427387905,"disagg_request_id":4611686018427387905,"encoded_opaque_state":"b3BhcXVl"}`
	cases := []struct {
		name  string
		api   request.API
		body  string
		resp  string
		want  string
		fails bool
	}{
		{
			name: "chat, params at top level, prompt_token_ids carried as prompt_token_ids",
			api:  request.APIChatCompletions,
			body: `{"model":"m","messages":[],"stream":true}`,
			resp: `{"id":"c","disaggregated_params":` + dp + `,"prompt_token_ids":[1,9007199254740993,3]}`,
			want: `{"model":"m","messages":[],"stream":true,"disaggregated_params":` + genDP + `,"prompt_token_ids":[1,9007199254740993,3]}`,
		},
		{
			name: "completions, params in choices[0], token ids replace the prompt",
			api:  request.APICompletions,
			body: `{"model":"m","prompt":"once upon","max_tokens":8}`,
			resp: `{"id":"c","choices":[{"text":"","disaggregated_params":` + dp + `,"prompt_token_ids":[7,8]}]}`,
			want: `{"model":"m","prompt":[7,8],"max_tokens":8,"disaggregated_params":` + genDP + `}`,
		},
		{
			name: "no prompt_token_ids: prompt kept",
			api:  request.APICompletions,
			body: `{"prompt":"p"}`,
			resp: `{"disaggregated_params":{"request_type":"context_only","disagg_request_id":5}}`,
			want: `{"prompt":"p","disaggregated_params":{"request_type":"generation_only","disagg_request_id":5}}`,
		},
		{
			name:  "no disaggregated_params fails (bad_response)",
			api:   request.APIChatCompletions,
			body:  `{"messages":[]}`,
			resp:  `{"choices":[{"text":""}]}`,
			fails: true,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := &TRTContextFirst{IDs: fixedIDs(t)}
			leg := &Leg{Body: []byte(c.body), API: c.api}
			plan, err := e.Prepare(context.Background(), leg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.Merge(leg, plan, []byte(c.resp))
			if c.fails {
				if err == nil {
					t.Fatalf("merge succeeded: %s", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.want {
				t.Errorf("generation body\n got %s\nwant %s", got, c.want)
			}
		})
	}
}

func TestTRTGenerationFirstPrepare(t *testing.T) {
	cases := []struct {
		name, serverInfo, want, wantCtx string
		wantErr                         bool
	}{
		{
			name:       "string endpoint with opaque state",
			serverInfo: `{"disaggregated_params":{"ctx_info_endpoint":"tcp://10.0.0.7:5555","ctx_dp_rank":0,"encoded_opaque_state":"c3RhdGU="}}`,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"temperature":0.2,` +
				`"disaggregated_params":{"request_type":"generation_only","disagg_request_id":4402240835584,"ctx_request_id":4402240835584,` +
				`"ctx_info_endpoint":"tcp://10.0.0.7:5555","ctx_dp_rank":0,"encoded_opaque_state":"c3RhdGU=","schedule_style":1}}`,
			wantCtx: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false,"temperature":0.2,` +
				`"disaggregated_params":{"request_type":"context_only","disagg_request_id":4402240835584,"schedule_style":1},"max_tokens":1}`,
		},
		{
			name:       "one-element array endpoint, rank 3, no opaque state",
			serverInfo: `{"disaggregated_params":{"ctx_info_endpoint":["tcp://h:1"],"ctx_dp_rank":3}}`,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"temperature":0.2,` +
				`"disaggregated_params":{"request_type":"generation_only","disagg_request_id":4402240835584,"ctx_request_id":4402240835584,` +
				`"ctx_info_endpoint":["tcp://h:1"],"ctx_dp_rank":3,"schedule_style":1}}`,
		},
		{name: "empty disaggregated_params (C++ transceiver)", serverInfo: `{"disaggregated_params":{}}`, wantErr: true},
		{name: "negative rank", serverInfo: `{"disaggregated_params":{"ctx_info_endpoint":"tcp://h:1","ctx_dp_rank":-1}}`, wantErr: true},
	}
	const body = `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"temperature":0.2}`
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := serverInfoServer(t, c.serverInfo)
			e := &TRTGenerationFirst{IDs: fixedIDs(t), ServerInfo: trt.NewServerInfoCache(trt.ServerInfoOptions{})}
			leg := &Leg{Body: []byte(body), Prefill: serverEndpoint(t, srv, "ctx-0", pool.EngineTRTLLM, nil, nil)}
			plan, err := e.Prepare(context.Background(), leg)
			if c.wantErr {
				if ae := asAPIError(t, err); ae.Status != 503 {
					t.Fatalf("got %v, want 503", ae)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(plan.DecodeBody) != c.want {
				t.Errorf("generation body\n got %s\nwant %s", plan.DecodeBody, c.want)
			}
			if c.wantCtx != "" && string(plan.PrefillBody) != c.wantCtx {
				t.Errorf("context body\n got %s\nwant %s", plan.PrefillBody, c.wantCtx)
			}
			if !plan.Async || !plan.BadResponseFails || !plan.FailsAfterResponse {
				t.Errorf("plan flags = %+v", plan)
			}
			if got, _ := e.Merge(leg, plan, []byte(`{"disaggregated_params":{"x":1}}`)); string(got) != c.want {
				t.Errorf("a late context response changed the generation body: %s", got)
			}
		})
	}
}
