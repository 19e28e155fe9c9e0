package sim

import (
	"context"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
)

// A finished prefill leg's KV is counted in KVHeld until its decode leg pulls it (vLLM), an
// SGLang /abort_request names its rid, or the hold expires.
func TestKVHeld(t *testing.T) {
	t.Run("vllm decode pulls", func(t *testing.T) {
		p, d := vllmPair(t)
		client := map[string]any{"model": testModel, "prompt": "hold me until the decode comes", "max_tokens": 2}
		pr := post(t, p.URL(), "/v1/completions", mustJSON(t, aibrixVLLMPrefill(client)))
		mustStatus(t, pr, 200)
		if st := p.Stats(); st.KVHeld != 1 {
			t.Fatalf("after the prefill leg: %+v, want KVHeld 1", st)
		}
		dec := maps.Clone(client)
		dec["kv_transfer_params"] = pr.json(t)["kv_transfer_params"]
		mustStatus(t, post(t, d.URL(), "/v1/completions", mustJSON(t, dec)), 200)
		if st := p.Stats(); st.KVHeld != 0 || st.KVUsedTokens != 0 {
			t.Fatalf("after the pull: %+v", st)
		}
	})
	t.Run("expires", func(t *testing.T) {
		params := testParams()
		params.KVHold = 20 // 20 ms at TimeScale 0.001
		p := startPod(t, PodConfig{Engine: EngineVLLM, Role: RolePrefill, Params: params})
		mustStatus(t, post(t, p.URL(), "/v1/completions", mustJSON(t, aibrixVLLMPrefill(map[string]any{"model": testModel, "prompt": "hold me"}))), 200)
		if _, err := p.WaitStats(testCtx(t), func(st Stats) bool { return st.KVHeld == 0 && st.KVUsedTokens == 0 }); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("sglang abort frees it", func(t *testing.T) {
		p, d := sglangPair(t, testParams())
		client := map[string]any{"model": testModel, "prompt": "an SGLang prompt", "max_tokens": 2}
		pre, dec := sglangLegs(p, client, 11, "req-11-0000000100000001")
		// The decode leg joins on arrival, then waits before it pulls: the prefill computes
		// the prompt and holds the KV meanwhile, its answer held back. The decode's client
		// leaves before the pull.
		ctx, cancel := context.WithCancel(testCtx(t))
		dc := make(chan struct{})
		body := mustJSON(t, dec)
		go func() {
			defer close(dc)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.URL()+"/v1/completions", strings.NewReader(body))
			req.Header.Set(HeaderFault, "pull-delay-10s")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		if _, err := d.WaitStats(testCtx(t), func(st Stats) bool { return st.DecodePrealloc == 1 }); err != nil {
			t.Fatal(err)
		}
		// SGLang answers the prefill leg only once its KV was sent (or freed).
		answered := make(chan int, 1)
		go func() {
			req, _ := http.NewRequestWithContext(testCtx(t), http.MethodPost, p.URL()+"/v1/completions", strings.NewReader(mustJSON(t, pre)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answered <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answered <- resp.StatusCode
		}()
		if _, err := p.WaitStats(testCtx(t), func(st Stats) bool { return st.KVHeld == 1 }); err != nil {
			t.Fatal(err)
		}
		cancel()
		<-dc
		if st := p.Stats(); st.KVHeld != 1 {
			t.Fatalf("the decode leg left without pulling: %+v, want the KV still held", st)
		}
		select {
		case code := <-answered:
			t.Fatalf("the prefill leg answered %d before its KV was sent or freed", code)
		default:
		}
		mustStatus(t, post(t, p.URL(), "/abort_request", `{"rid":"req-11-0000000100000001"}`), 200)
		if st := p.Stats(); st.KVHeld != 0 || st.KVUsedTokens != 0 {
			t.Fatalf("after /abort_request: %+v", st)
		}
		if code := <-answered; code != 200 {
			t.Fatalf("the prefill leg answered %d once its KV was freed, want 200", code)
		}
	})
}
