package handoffe2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/sim"
	"github.com/tandem-epp/tandem/internal/wire"
)

// proofStack is one vLLM prefill pod and two decode pods of one roleset behind Tandem (epp
// hand-off) and the gateway.
type proofStack struct {
	*stack
	decodes   [2]*sim.Server
	maxTokens int // of each request; 3 when 0
}

// proofOptions shape a proofStack.
type proofOptions struct {
	env         map[string]string
	decodeScale float64 // the decode pods' time scale
	sidecar     bool    // the decode pods run llm-d's routing sidecar (they run the prefill leg)
}

func newProofStack(t *testing.T, o proofOptions) *proofStack {
	t.Helper()
	ps := &proofStack{stack: &stack{t: t, prefill: startNamedPod(t, "prefill-0", sim.RolePrefill, simTimeScale, false)}}
	eps := []demo.FileEndpoint{entry("prefill-0", ps.prefill, sim.EngineVLLM, "prefill", nil, nil)}
	for i := range ps.decodes {
		ps.decodes[i] = startNamedPod(t, fmt.Sprintf("decode-%d", i), sim.RoleDecode, o.decodeScale, o.sidecar)
		eps = append(eps, entry(fmt.Sprintf("decode-%d", i), ps.decodes[i], sim.EngineVLLM, "decode", nil, nil))
	}
	path := writePool(t, eps...)
	ps.app = startTandem(t, []string{"--endpoints-file=" + path}, o.env)
	ps.url = startGateway(t, ps.app.ExtProcAddr())
	ps.decode = ps.decodes[0]
	t.Cleanup(ps.checkReleased)
	return ps
}

// startNamedPod starts a vLLM pod whose answers name it (X-Sim-Pod), its model time run at scale.
func startNamedPod(t *testing.T, name, role string, scale float64, sidecar bool) *sim.Server {
	t.Helper()
	p := sim.DefaultParams()
	p.KVHold = 10 / scale // 10 s of wall time
	return sim.StartForTest(t, sim.PodConfig{Name: name, Engine: sim.EngineVLLM, Role: role, Model: modelName, Params: p,
		TimeScale: scale, RoutingSidecar: sidecar})
}

// pdRequests counts the PD requests a decode pod received (not the legs its sidecar built).
func pdRequests(s *sim.Server) int {
	n := 0
	for _, r := range inferences(s) {
		if r.Header.Get(sim.HeaderSidecarLeg) == "" {
			n++
		}
	}
	return n
}

// ask sends request i (a prompt of its own, so no decode pod holds it in its prefix cache),
// streamed with the final usage chunk or whole, and returns the reply.
func (ps *proofStack) ask(ctx context.Context, i int, stream bool, header map[string]string) reply {
	ps.t.Helper()
	r := ps.try(ctx, i, stream, header)
	if r.status != http.StatusOK || r.readErr != nil {
		ps.t.Fatalf("request %d (stream %v): %d %v %s", i, stream, r.status, r.readErr, r.body)
	}
	return r
}

// try sends request i and returns whatever came back.
func (ps *proofStack) try(ctx context.Context, i int, stream bool, header map[string]string) reply {
	ps.t.Helper()
	n := ps.maxTokens
	if n == 0 {
		n = 3
	}
	body := map[string]any{"model": modelName, "max_tokens": n,
		"messages": []any{map[string]any{"role": "user", "content": fmt.Sprintf("request %d: %s", i, strings.Repeat("tell me about the sea ", 15))}}}
	if stream {
		body["stream"], body["stream_options"] = true, map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	return ps.post(ctx, "/v1/chat/completions", b, header)
}

func (ps *proofStack) transfers(result, decode string) float64 {
	return ps.counter("tandem_pd_transfer_total", map[string]string{"result": result, "prefill_pod": "default/prefill-0", "decode_pod": "default/" + decode})
}

// TestRecomputeDetected: a decode pod whose KV connector is broken recomputes every prompt and
// still answers 200. The proof catches it within its first 3 PD requests, counts it, and (the
// lenient policy) the pod receives no PD work for at least 5 s after; every request succeeds,
// and while the pool was healthy nothing counted as recomputed.
func TestRecomputeDetected(t *testing.T) {
	t.Run("epp", func(t *testing.T) {
		recomputeDetected(t, newProofStack(t, proofOptions{env: eppEnv(map[string]string{"TANDEM_PD_TRANSFER_HEADER": "true"}),
			decodeScale: simTimeScale}), true)
	})
	// llm-d's routing sidecar runs the prefill leg: only the decode answer's usage is evidence.
	t.Run("sidecar", func(t *testing.T) {
		recomputeDetected(t, newProofStack(t, proofOptions{env: map[string]string{"TANDEM_PD_HANDOFF": "sidecar"},
			decodeScale: simTimeScale, sidecar: true}), false)
	})
}

func recomputeDetected(t *testing.T, ps *proofStack, header bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*waitLimit)
	defer cancel()
	bad, good := ps.decodes[0], ps.decodes[1]

	// A healthy pool: every transfer verified, none recomputed, on both decode pods.
	i := 0
	for ; i < 40 && (pdRequests(bad) < 2 || pdRequests(good) < 2); i++ {
		r := ps.ask(ctx, i, i%2 == 0, nil)
		if header && i%2 == 1 && r.header.Get(wire.HeaderPDTransfer) != "verified" { // whole answers: known before the headers
			t.Fatalf("healthy request %d: %s %q, want verified", i, wire.HeaderPDTransfer, r.header.Get(wire.HeaderPDTransfer))
		}
	}
	if pdRequests(bad) < 2 || pdRequests(good) < 2 {
		t.Fatalf("the picker never spread requests over both decode pods (%d, %d)", pdRequests(bad), pdRequests(good))
	}
	healthy := i
	if n := ps.transfers("recomputed", "decode-0") + ps.transfers("recomputed", "decode-1"); n != 0 {
		t.Fatalf("a healthy pool counted %v recomputed transfers", n)
	}
	if n := ps.transfers("verified", "decode-0") + ps.transfers("verified", "decode-1"); n != float64(healthy) {
		t.Fatalf("a healthy pool verified %v of %d transfers", n, healthy)
	}

	// decode-0's KV connector breaks.
	if err := bad.SetFaults(sim.Faults{RecomputeKV: true}); err != nil {
		t.Fatal(err)
	}
	before := pdRequests(bad)
	var detected time.Time
	for ; i < healthy+60 && detected.IsZero(); i++ {
		ps.ask(ctx, i, i%2 == 0, nil)
		if ps.transfers("recomputed", "decode-0") >= 2 {
			detected = time.Now()
		}
	}
	got := pdRequests(bad) - before
	if detected.IsZero() {
		t.Fatalf("never detected: decode-0 got %d PD requests after its connector broke, %v counted recomputed", got, ps.transfers("recomputed", "decode-0"))
	}
	if got > 3 {
		t.Fatalf("detected only after decode-0's %d-th PD request since its connector broke, want within 3", got)
	}
	t.Logf("detected after %d PD requests on the recomputing pod (%d requests in all)", got, i-healthy)

	// Held out: for 5 s every request goes to the other pair; all succeed and verify.
	held := pdRequests(bad)
	verified := ps.transfers("verified", "decode-1")
	n := 0
	for ; time.Since(detected) < 5*time.Second; i++ {
		ps.ask(ctx, i, i%2 == 0, nil)
		n++
		time.Sleep(20 * time.Millisecond)
	}
	if extra := pdRequests(bad) - held; extra != 0 {
		t.Fatalf("decode-0 received %d PD requests within 5 s after detection", extra)
	}
	if v := ps.transfers("verified", "decode-1") - verified; v != float64(n) {
		t.Fatalf("decode-1 verified %v of the %d requests sent after detection", v, n)
	}
	if ps.transfers("recomputed", "decode-1") != 0 {
		t.Fatal("the healthy decode pod counted a recomputed transfer")
	}
}

// TestStrictModeNeverServesRecomputed: under the strict policy a request whose decode pod
// recomputed the prompt never completes as a success. Found before the response headers (a
// whole answer, held until its body arrives) it is a 502 with x-error-pd-decode; found after
// them (a stream whose usage comes after its first tokens) the stream is cut before its end.
// Requests the healthy pair serves succeed.
func TestStrictModeNeverServesRecomputed(t *testing.T) {
	for _, c := range []struct {
		name   string
		stream bool
		// decode pods' time scale and output length: a stream's tokens must come in chunks of
		// their own, so that its headers go out before its usage.
		scale     float64
		maxTokens int
	}{
		{"whole", false, simTimeScale, 3},
		{"stream", true, 0.05, 30},
	} {
		t.Run(c.name, func(t *testing.T) {
			ps := newProofStack(t, proofOptions{env: eppEnv(map[string]string{"TANDEM_PD_TRANSFER_PROOF": "strict"}), decodeScale: c.scale})
			ps.maxTokens = c.maxTokens
			ctx, cancel := context.WithTimeout(context.Background(), 4*waitLimit)
			defer cancel()
			if err := ps.decodes[0].SetFaults(sim.Faults{RecomputeKV: true}); err != nil {
				t.Fatal(err)
			}
			var refused, cut, ok int
			for i := 0; i < 20; i++ {
				r := ps.try(ctx, i, c.stream, nil)
				complete := r.status == http.StatusOK && r.readErr == nil
				if complete && c.stream {
					complete = strings.Contains(string(r.body), "data: [DONE]")
				}
				switch {
				case complete:
					if pod := r.header.Get("X-Sim-Pod"); pod != "decode-1" {
						t.Fatalf("request %d completed as a success from %q: strict mode served an unverified transfer", i, pod)
					}
					ok++
				case r.status == http.StatusBadGateway:
					if r.header.Get("x-error-pd-decode") != "true" || !strings.Contains(string(r.body), "transfer proof strict") {
						t.Fatalf("request %d: 502 without x-error-pd-decode or the reason: %v %s", i, r.header, r.body)
					}
					refused++
				case c.stream && r.status == http.StatusOK:
					cut++ // cut short: no [DONE]
				default:
					t.Fatalf("request %d: unexpected %d %v %s", i, r.status, r.readErr, r.body)
				}
			}
			failed := refused + cut
			if ok == 0 || failed == 0 {
				t.Fatalf("ok %d, refused %d, cut %d: the test never reached both decode pods", ok, refused, cut)
			}
			if c.stream && cut == 0 {
				t.Fatalf("no stream was cut (%d refused before their headers): the after-headers path went untested", refused)
			}
			counted := ps.transfers("recomputed", "decode-0") + ps.transfers("unknown", "decode-0")
			if counted != float64(failed) {
				t.Fatalf("%v unverified transfers counted on decode-0, %d requests failed", counted, failed)
			}
			if ps.transfers("recomputed", "decode-1")+ps.transfers("unknown", "decode-1") != 0 {
				t.Fatal("the healthy decode pod counted an unverified transfer")
			}
			t.Logf("%d served by the healthy pair, %d refused with a 502, %d streams cut", ok, refused, cut)
		})
	}
}

// SGLang decode pods cannot compute a PD request's prompt themselves: each answered PD request
// counts as verified, by protocol, whatever its cached_tokens say.
func TestSGLangTransfersVerifiedByProtocol(t *testing.T) {
	st := newStack(t, stackOptions{engine: sim.EngineSGLang, env: eppEnv(nil)})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for _, c := range []clientCase{{chat: true, stream: true}, {chat: false, stream: false}} {
		if r := st.post(ctx, c.path(), c.body(), nil); r.status != http.StatusOK || r.readErr != nil {
			t.Fatalf("%s: %d %v %s", c, r.status, r.readErr, r.body)
		}
	}
	if n := st.counter("tandem_pd_transfer_total", map[string]string{"result": "verified"}); n != 2 {
		t.Fatalf("%v SGLang transfers verified, want 2 (recomputed %v, unknown %v)", n,
			st.counter("tandem_pd_transfer_total", map[string]string{"result": "recomputed"}),
			st.counter("tandem_pd_transfer_total", map[string]string{"result": "unknown"}))
	}
}

// TestSGLangDecodeWithoutTheKVNotVerified: an SGLang pod labelled decode that does not take the
// KV (started without --disaggregation-mode decode, or its connector broken) computes the
// prompt itself and answers 200, while the prefill leg waits for a decode peer that never
// comes. Its answer is no proof: not verified.
func TestSGLangDecodeWithoutTheKVNotVerified(t *testing.T) {
	st := newStack(t, stackOptions{engine: sim.EngineSGLang, env: eppEnv(nil)})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c := clientCase{chat: true, stream: true}
	if r := st.post(ctx, c.path(), c.body(), map[string]string{sim.HeaderFault: "decode-recompute"}); r.status != http.StatusOK || r.readErr != nil {
		t.Fatalf("%d %v %s", r.status, r.readErr, r.body)
	}
	var judged float64
	if !eventually(func() bool {
		judged = st.counter("tandem_pd_transfer_total", map[string]string{"result": "unknown"}) +
			st.counter("tandem_pd_transfer_total", map[string]string{"result": "recomputed"})
		return judged == 1
	}) {
		t.Fatalf("the transfer was not judged unknown or recomputed (verified %v)", st.counter("tandem_pd_transfer_total", map[string]string{"result": "verified"}))
	}
	if v := st.counter("tandem_pd_transfer_total", map[string]string{"result": "verified"}); v != 0 {
		t.Errorf("a decode answer computed without the KV was verified %v times", v)
	}
}
