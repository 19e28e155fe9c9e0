package handoffe2e

import (
	"context"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/sim"
)

// pullDelay makes the decode leg wait, its KV blocks allocated, before it pulls the prefill
// pod's KV: the prefill leg finishes and its pod holds the KV meanwhile.
var pullDelay = map[string]string{sim.HeaderFault: "decode-pull-delay-10s"}

// leaveAfterPrefill sends a streaming request whose decode leg is slow to pull its KV, waits
// until the prefill pod holds the KV (and, but for SGLang, Tandem has the prefill leg's answer),
// then the client goes away. It returns when it left.
func (st *stack) leaveAfterPrefill(ctx context.Context) time.Time {
	st.t.Helper()
	reqCtx, cancelReq := context.WithCancel(ctx)
	done := make(chan reply, 1)
	c := clientCase{chat: true, stream: true}
	go func() { done <- st.post(reqCtx, c.path(), c.body(), pullDelay) }()
	if _, err := st.prefill.WaitStats(ctx, func(s sim.Stats) bool { return s.KVHeld == 1 }); err != nil {
		st.t.Fatalf("the prefill pod never held the KV: %v", err)
	}
	if _, err := st.decode.WaitStats(ctx, func(s sim.Stats) bool { return s.DecodePrealloc == 1 }); err != nil {
		st.t.Fatalf("the decode leg never waited to pull: %v", err)
	}
	// SGLang answers the prefill leg only once its KV was sent, so there the KV is stranded
	// while the leg waits; vLLM's prefill leg answers first, and its pod holds the KV after.
	if st.prefill.Config().Engine != sim.EngineSGLang {
		success := map[string]string{"status": "pd-prefill-request-success"}
		if !eventually(func() bool { return st.counter("gateway_prefill_request_success_total", success) == 1 }) {
			st.t.Fatal("Tandem never counted the prefill leg's answer")
		}
	}
	left := time.Now()
	cancelReq()
	if r := <-done; r.readErr == nil {
		st.t.Fatalf("the cancelled request completed: %d %s", r.status, r.body)
	}
	return left
}

// TestStrandedKVReleased: an SGLang PD request whose client leaves after the prefill pod
// computed the prompt, before the decode leg pulled the KV (SGLang's prefill leg is still
// waiting to send it). Tandem sends the prefill pod /abort_request
// with the legs' rid within 1 s, the pod frees the KV, and the metrics count the release and
// the seconds the KV was held.
func TestStrandedKVReleased(t *testing.T) {
	st := newStack(t, stackOptions{engine: sim.EngineSGLang, env: eppEnv(nil)})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	left := st.leaveAfterPrefill(ctx)

	if _, err := st.prefill.WaitStats(ctx, func(s sim.Stats) bool { return s.KVHeld == 0 && s.KVUsedTokens == 0 }); err != nil {
		t.Fatalf("the prefill pod still holds the KV: %+v (%v)", st.prefill.Stats(), err)
	}
	took := time.Since(left)
	t.Logf("the prefill pod released the KV %s after the client left", took)
	if took > time.Second {
		t.Errorf("the prefill pod was told %s after the client left, want within 1s", took)
	}
	pre := inferences(st.prefill)
	if len(pre) != 1 {
		t.Fatalf("%d prefill legs, want 1", len(pre))
	}
	if rids, want := abortRIDs(st.prefill), gjson.GetBytes(pre[0].Body, "rid").Str; len(rids) != 1 || rids[0] != want {
		t.Errorf("prefill pod aborts %q, want one for the legs' rid %q", rids, want)
	}

	sent := map[string]string{"engine": "sglang", "result": "sent"}
	if !eventually(func() bool { return st.counter("tandem_pd_prefill_release_total", sent) == 1 }) {
		t.Errorf("tandem_pd_prefill_release_total%v = %v, want 1", sent, st.counter("tandem_pd_prefill_release_total", sent))
	}
	released := map[string]string{"namespace": "default", "pod_name": "prefill-0", "end": "released"}
	if v := st.counter("tandem_pd_stranded_kv_seconds_total", released); v <= 0 || v > took.Seconds()+waitLimit.Seconds() {
		t.Errorf("tandem_pd_stranded_kv_seconds_total%v = %v, want the seconds the KV was held", released, v)
	}
	for _, end := range []string{"consumed", "expired"} {
		if v := st.counter("tandem_pd_stranded_kv_seconds_total", map[string]string{"end": end}); v != 0 {
			t.Errorf("tandem_pd_stranded_kv_seconds_total{end=%s} = %v, want 0", end, v)
		}
	}
}

// TestStrandedKVConsumed: a PD request that completes counts its prefill pod's hold as
// consumed (the decode leg's first token came), and releases nothing.
func TestStrandedKVConsumed(t *testing.T) {
	st := newStack(t, stackOptions{engine: sim.EngineVLLM, env: eppEnv(nil)})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c := clientCase{chat: true, stream: true}
	if r := st.post(ctx, c.path(), c.body(), nil); r.status != 200 || r.readErr != nil || r.text() == "" {
		t.Fatalf("request: %d %v %s", r.status, r.readErr, r.body)
	}
	consumed := map[string]string{"namespace": "default", "pod_name": "prefill-0", "end": "consumed"}
	if !eventually(func() bool { return st.counter("tandem_pd_stranded_kv_seconds_total", consumed) > 0 }) {
		t.Errorf("tandem_pd_stranded_kv_seconds_total%v = 0, want the hold counted", consumed)
	}
	if n := st.series("tandem_pd_stranded_kv_seconds_total"); n != 1 {
		t.Errorf("tandem_pd_stranded_kv_seconds_total has %d series, want only end=consumed", n)
	}
	if n := st.series("tandem_pd_prefill_release_total"); n != 0 {
		t.Errorf("tandem_pd_prefill_release_total has %d series after a completed request, want none", n)
	}
	if s := st.prefill.Stats(); s.KVHeld != 0 {
		t.Errorf("the prefill pod still holds KV: %+v", s)
	}
}

// TestStrandedKVUnsupported: vLLM has no call that frees a finished prefill's KV. A client
// that leaves before the pull is counted unsupported, and the hold as expired once
// TANDEM_PD_KV_HOLD_TIMEOUT_SECONDS passed; the prefill pod keeps the KV meanwhile.
func TestStrandedKVUnsupported(t *testing.T) {
	st := newStack(t, stackOptions{engine: sim.EngineVLLM, env: eppEnv(map[string]string{"TANDEM_PD_KV_HOLD_TIMEOUT_SECONDS": "1"})})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	st.leaveAfterPrefill(ctx)

	unsupported := map[string]string{"engine": "vllm", "result": "unsupported"}
	if !eventually(func() bool { return st.counter("tandem_pd_prefill_release_total", unsupported) == 1 }) {
		t.Errorf("tandem_pd_prefill_release_total%v = %v, want 1", unsupported, st.counter("tandem_pd_prefill_release_total", unsupported))
	}
	expired := map[string]string{"namespace": "default", "pod_name": "prefill-0", "end": "expired"}
	if !eventually(func() bool { return st.counter("tandem_pd_stranded_kv_seconds_total", expired) == 1 }) {
		t.Errorf("tandem_pd_stranded_kv_seconds_total%v = %v, want 1 (the hold timeout)", expired, st.counter("tandem_pd_stranded_kv_seconds_total", expired))
	}
	if n := len(abortRIDs(st.prefill)); n != 0 {
		t.Errorf("a vLLM prefill pod got %d /abort_request calls", n)
	}
	if s := st.prefill.Stats(); s.KVHeld != 1 {
		t.Errorf("the vLLM prefill pod should still hold the KV (its own timeout frees it): %+v", s)
	}
}

// TestStrandedKVDecodeFailed: an SGLang decode leg that fails before its first token (here a
// 500 before it joined the bootstrap room) ends the request; Tandem tells the prefill pod, whose
// leg would otherwise wait for its decode peer until the bootstrap timeout.
func TestStrandedKVDecodeFailed(t *testing.T) {
	st := newStack(t, stackOptions{engine: sim.EngineSGLang, env: eppEnv(nil)})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c := clientCase{chat: true, stream: true}
	if r := st.post(ctx, c.path(), c.body(), map[string]string{sim.HeaderFault: "decode-500"}); r.status != 500 {
		t.Fatalf("status %d, want the decode pod's 500: %s", r.status, r.body)
	}
	rids, err := waitAborts(ctx, st.prefill, 1)
	if err != nil {
		t.Fatalf("the prefill pod was never told: %v", err)
	}
	// Both legs carry the rid. The prefill leg runs beside the decode leg, so a decode pod that
	// fails at once can end the request before the prefill leg reached its pod: the hand-off
	// then cancels the leg, and the abort finds nothing there to free.
	dec := inferences(st.decode)
	if len(dec) != 1 || len(rids) != 1 || rids[0] != gjson.GetBytes(dec[0].Body, "rid").Str {
		t.Fatalf("prefill pod aborts %q for %d decode legs, want one for the legs' rid", rids, len(dec))
	}
	if pre := inferences(st.prefill); len(pre) > 1 || len(pre) == 1 && gjson.GetBytes(pre[0].Body, "rid").Str != rids[0] {
		t.Fatalf("prefill pod aborts %q for %d prefill legs, want one for the legs' rid", rids, len(pre))
	}
	if _, err := st.prefill.WaitStats(ctx, func(s sim.Stats) bool { return s.PrefillBootstrap == 0 && s.Running == 0 && s.KVHeld == 0 }); err != nil {
		t.Fatalf("the prefill leg still waits: %+v (%v)", st.prefill.Stats(), err)
	}
	sent := map[string]string{"engine": "sglang", "result": "sent"}
	if !eventually(func() bool { return st.counter("tandem_pd_prefill_release_total", sent) == 1 }) {
		t.Errorf("tandem_pd_prefill_release_total%v = %v, want 1", sent, st.counter("tandem_pd_prefill_release_total", sent))
	}
}

// TestSGLangSentKVIsNotReleased: SGLang answers its prefill leg only once the KV was sent, so a
// client that leaves after that (the decode leg generating a whole answer) strands nothing:
// no /abort_request goes to the prefill pod, and its hold counts as consumed, not released.
func TestSGLangSentKVIsNotReleased(t *testing.T) {
	st := newStack(t, stackOptions{engine: sim.EngineSGLang, env: eppEnv(nil)})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	reqCtx, cancelReq := context.WithCancel(ctx)
	done := make(chan reply, 1)
	c := clientCase{chat: true, stream: false}
	go func() {
		done <- st.post(reqCtx, c.path(), c.body(), map[string]string{sim.HeaderFault: "decode-hang-after-1"})
	}()
	success := map[string]string{"status": "pd-prefill-request-success"}
	if !eventually(func() bool { return st.counter("gateway_prefill_request_success_total", success) == 1 }) {
		t.Fatal("the prefill leg never answered")
	}
	if s := st.prefill.Stats(); s.KVHeld != 0 {
		t.Fatalf("the prefill pod still holds the KV after its leg answered: %+v", s)
	}
	cancelReq()
	if r := <-done; r.readErr == nil {
		t.Fatalf("the cancelled request completed: %d %s", r.status, r.body)
	}
	consumed := map[string]string{"namespace": "default", "pod_name": "prefill-0", "end": "consumed"}
	if !eventually(func() bool { return st.counter("tandem_pd_stranded_kv_seconds_total", consumed) > 0 }) {
		t.Errorf("tandem_pd_stranded_kv_seconds_total%v = 0, want the hold counted consumed", consumed)
	}
	st.checkReleased()
	if rids := abortRIDs(st.prefill); len(rids) != 0 {
		t.Errorf("the prefill pod was sent /abort_request %q for KV it had already sent", rids)
	}
	for _, res := range []string{"sent", "failed"} {
		if v := st.counter("tandem_pd_prefill_release_total", map[string]string{"engine": "sglang", "result": res}); v != 0 {
			t.Errorf("tandem_pd_prefill_release_total{result=%s} = %v, want 0", res, v)
		}
	}
	if v := st.counter("tandem_pd_stranded_kv_seconds_total", map[string]string{"end": "released"}); v != 0 {
		t.Errorf("tandem_pd_stranded_kv_seconds_total{end=released} = %v, want 0", v)
	}
}
