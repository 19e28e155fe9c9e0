package handoff

import (
	"context"
	"testing"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// The body work Tandem adds to a request, per engine (no network).
func BenchmarkPrepareAndMerge(b *testing.B) {
	const resp = `{"id":"c","choices":[{"text":"x","disaggregated_params":{"request_type":"context_only","disagg_request_id":4611686018427387905,"first_gen_tokens":[42]}}],` +
		`"prompt_token_ids":[1,2,3],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1,2,3],"remote_host":"h","remote_port":7}}`
	ids := fixedIDsB(b)
	for _, e := range []Engine{&VLLM{Connector: ConnectorSHFS}, &VLLM{Connector: ConnectorNIXL}, &SGLang{}, &TRTContextFirst{IDs: ids}} {
		b.Run(e.Name(), func(b *testing.B) {
			leg := &Leg{RequestID: "req-1", Body: []byte(chatBody), API: request.APIChatCompletions,
				Prefill: endpoint("p0", "10.1.2.3", 8000, pool.EngineVLLM, nil, nil)}
			b.ReportAllocs()
			for b.Loop() {
				plan, err := e.Prepare(context.Background(), leg)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := e.Merge(leg, plan, []byte(resp)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
