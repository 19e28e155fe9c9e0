package handoff

import (
	"context"
	"testing"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50,"stream":true,"stream_options":{"include_usage":true},"min_tokens":2,"temperature":0.7}`

func TestVLLMPrepare(t *testing.T) {
	cases := []struct {
		name, connector, body, wantPrefill string
	}{
		{
			name:      "shfs: kv_transfer_params asks for a remote decode; one token, no stream",
			connector: ConnectorSHFS, body: chatBody,
			wantPrefill: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":false,"temperature":0.7,` +
				`"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},` +
				`"max_completion_tokens":1}`,
		},
		{
			name:      "shfs: the client's own kv_transfer_params and max_completion_tokens are overridden in place",
			connector: ConnectorSHFS,
			body:      `{"model":"m","prompt":"p","kv_transfer_params":{"x":1},"max_completion_tokens":9}`,
			wantPrefill: `{"model":"m","prompt":"p","kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},` +
				`"max_completion_tokens":1,"max_tokens":1,"stream":false}`,
		},
		{
			name:      "nixl: no kv_transfer_params",
			connector: ConnectorNIXL, body: chatBody,
			wantPrefill: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":false,"temperature":0.7,"max_completion_tokens":1}`,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := &VLLM{Connector: c.connector}
			before := c.body
			body := []byte(c.body)
			plan, err := v.Prepare(context.Background(), &Leg{Body: body})
			if err != nil {
				t.Fatal(err)
			}
			if got := string(plan.PrefillBody); got != c.wantPrefill {
				t.Errorf("prefill body\n got %s\nwant %s", got, c.wantPrefill)
			}
			if string(plan.DecodeBody) != c.body || plan.Async || !plan.BadResponseFails || plan.RID != "" {
				t.Errorf("plan = %+v, want sync, decode body = client body", plan)
			}
			if string(body) != before {
				t.Errorf("client body changed: %s", body)
			}
		})
	}
}

func TestVLLMMerge(t *testing.T) {
	prefill := endpoint("p0", "10.1.2.3", 8000, pool.EngineVLLM, nil, nil)
	const kvResp = `{"id":"cmpl-1","choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_decode":false,"do_remote_prefill":true,` +
		`"remote_engine_id":"e-1","remote_block_ids":[1,2,9007199254740993],"remote_host":"0.0.0.0","remote_port":5600,"opaque":{"k":[1.50,"v"]}}}`
	cases := []struct {
		name, connector, resp, want string
	}{
		{
			name:      "shfs: the response's params with remote_host = prefill pod IP, client's max_tokens and stream kept, big ints exact",
			connector: ConnectorSHFS, resp: kvResp,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50,"stream":true,"stream_options":{"include_usage":true},"min_tokens":2,"temperature":0.7,` +
				`"kv_transfer_params":{"do_remote_decode":false,"do_remote_prefill":true,"remote_engine_id":"e-1","remote_block_ids":[1,2,9007199254740993],"remote_host":"10.1.2.3","remote_port":5600,"opaque":{"k":[1.50,"v"]}}}`,
		},
		{
			name:      "shfs: no kv_transfer_params in the response leaves the client's body (decode recomputes)",
			connector: ConnectorSHFS, resp: `{"id":"cmpl-1","choices":[]}`, want: chatBody,
		},
		{
			name:      "shfs: kv_transfer_params null is the same as missing",
			connector: ConnectorSHFS, resp: `{"kv_transfer_params":null}`, want: chatBody,
		},
		{
			name:      "shfs: params without remote_host get one",
			connector: ConnectorSHFS, resp: `{"kv_transfer_params":{"remote_port":1}}`,
			want: chatBody[:len(chatBody)-1] + `,"kv_transfer_params":{"remote_port":1,"remote_host":"10.1.2.3"}}`,
		},
		{
			name:      "nixl: the whole response as disagg_prefill_resp",
			connector: ConnectorNIXL, resp: "{\"id\":\"cmpl-1\",\"n\":12345678901234567890}\n",
			want: chatBody[:len(chatBody)-1] + `,"disagg_prefill_resp":{"id":"cmpl-1","n":12345678901234567890}}`,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := &VLLM{Connector: c.connector}
			leg := &Leg{Body: []byte(chatBody), Prefill: prefill, API: request.APIChatCompletions}
			plan, err := v.Prepare(context.Background(), leg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := v.Merge(leg, plan, []byte(c.resp))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.want {
				t.Errorf("decode body\n got %s\nwant %s", got, c.want)
			}
			if string(leg.Body) != chatBody {
				t.Errorf("client body changed: %s", leg.Body)
			}
		})
	}
}

func TestCheckControlledRefusesAmbiguousBodies(t *testing.T) {
	cases := []struct {
		name, body, param string
	}{
		{"duplicate max_tokens", `{"model":"m","max_tokens":5,"prompt":"p","max_tokens":7}`, "max_tokens"},
		{"duplicate stream", `{"stream":true,"stream":false}`, "stream"},
		{"duplicate kv_transfer_params", `{"kv_transfer_params":{},"kv_transfer_params":{}}`, "kv_transfer_params"},
		{"not JSON", `{"model":`, ""},
		{"not an object", `["model"]`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := (&VLLM{Connector: ConnectorSHFS}).Prepare(context.Background(), &Leg{Body: []byte(c.body)})
			ae := asAPIError(t, err)
			if ae.Status != 400 || ae.Param != c.param {
				t.Errorf("got %d param %q (%v), want 400 param %q", ae.Status, ae.Param, ae, c.param)
			}
		})
	}
	// Duplicates of keys Tandem does not touch are the engine's business.
	if _, err := (&VLLM{Connector: ConnectorSHFS}).Prepare(context.Background(),
		&Leg{Body: []byte(`{"temperature":1,"temperature":2}`)}); err != nil {
		t.Errorf("duplicate uncontrolled key refused: %v", err)
	}
}
