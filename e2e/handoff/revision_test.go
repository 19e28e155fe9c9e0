package handoffe2e

import (
	"context"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/sim"
)

// labelRevision is the default pair-match label (TANDEM_PAIR_MATCH_LABELS).
const labelRevision = "disaggregatedset.x-k8s.io/revision"

// revisionPod is a vLLM pod of revision rev: its KV format is rev and, a decode pod, it
// recomputes a prompt whose KV it cannot load (kv_load_failure_policy recompute), as a
// rolled-out engine that cannot read another build's KV would.
func revisionPod(t *testing.T, name, role, rev string) (*sim.Server, demo.FileEndpoint) {
	t.Helper()
	p := sim.DefaultParams()
	p.KVHold = 10 / simTimeScale // 10 s of wall time
	s := sim.StartForTest(t, sim.PodConfig{Name: name, Engine: sim.EngineVLLM, Role: role, Model: modelName, Params: p,
		TimeScale: simTimeScale, KVFormat: rev, KVLoadFailurePolicy: sim.KVLoadRecompute})
	return s, entry(name, s, sim.EngineVLLM, role, map[string]string{labelRevision: rev}, nil)
}

// revisionStack is one roleset in the middle of a rollout behind Tandem (epp hand-off) and the
// gateway: prefill-a, decode-a and decode-b, plus prefill-b when withPrefillB.
func revisionStack(t *testing.T, env map[string]string, withPrefillB bool) (ps *proofStack, prefillB *sim.Server) {
	t.Helper()
	prefillA, pa := revisionPod(t, "prefill-a", sim.RolePrefill, "a")
	decodeA, da := revisionPod(t, "decode-a", sim.RoleDecode, "a")
	decodeB, db := revisionPod(t, "decode-b", sim.RoleDecode, "b")
	eps := []demo.FileEndpoint{pa, da, db}
	if withPrefillB {
		var pb demo.FileEndpoint
		prefillB, pb = revisionPod(t, "prefill-b", sim.RolePrefill, "b")
		eps = append(eps, pb)
	}
	ps = &proofStack{stack: &stack{t: t, prefill: prefillA, decode: decodeA}, decodes: [2]*sim.Server{decodeA, decodeB}}
	ps.app = startTandem(t, []string{"--endpoints-file=" + writePool(t, eps...)}, env)
	ps.url = startGateway(t, ps.app.ExtProcAddr())
	t.Cleanup(ps.checkReleased)
	return ps, prefillB
}

// pairTransfers is tandem_pd_transfer_total for one pod pair and result.
func (ps *proofStack) pairTransfers(result, prefill, decode string) float64 {
	return ps.counter("tandem_pd_transfer_total", map[string]string{"result": result, "prefill_pod": "default/" + prefill, "decode_pod": "default/" + decode})
}

// crossPDRequests counts the PD requests decode pod d received whose KV came from a prefill
// pod of another KV format, as the prefill leg announced it in kv_transfer_params.
func crossPDRequests(d *sim.Server, format string) int {
	n := 0
	for _, r := range inferences(d) {
		if f := gjson.GetBytes(r.Body, "kv_transfer_params."+sim.FieldKVFormat); f.Exists() && f.Str != format {
			n++
		}
	}
	return n
}

// TestRevisionSkewCaughtOrAvoided: a roleset mid-rollout holds pods of revisions a and b whose
// KV formats differ; a decode pod given the other revision's KV recomputes the prompt and still
// answers 200. With the default pair-match labels Tandem never pairs across revisions: both
// revisions' pairs serve, every transfer is verified, none recomputed. With the check off
// (TANDEM_PAIR_MATCH_LABELS=none) cross-revision pairs happen; the transfer proof judges them
// recomputed and the lenient policy holds the skewed decode pod out of PD work.
func TestRevisionSkewCaughtOrAvoided(t *testing.T) {
	t.Run("avoided", func(t *testing.T) {
		ps, prefillB := revisionStack(t, eppEnv(nil), true)
		ctx, cancel := context.WithTimeout(context.Background(), 4*waitLimit)
		defer cancel()
		decodeA, decodeB := ps.decodes[0], ps.decodes[1]
		n := 0
		for ; n < 60 && (pdRequests(decodeA) < 3 || pdRequests(decodeB) < 3); n++ {
			ps.ask(ctx, n, n%2 == 0, nil)
		}
		if pdRequests(decodeA) < 3 || pdRequests(decodeB) < 3 {
			t.Fatalf("the picker never spread requests over both revisions (decode-a %d, decode-b %d)", pdRequests(decodeA), pdRequests(decodeB))
		}
		if len(inferences(ps.prefill)) == 0 || len(inferences(prefillB)) == 0 {
			t.Fatalf("a revision's prefill pod served nothing (prefill-a %d, prefill-b %d)", len(inferences(ps.prefill)), len(inferences(prefillB)))
		}
		if a, b := crossPDRequests(decodeA, "a"), crossPDRequests(decodeB, "b"); a+b != 0 {
			t.Fatalf("cross-revision pairs served requests: decode-a got %d of revision b's KV, decode-b %d of revision a's", a, b)
		}
		if x := ps.pairTransfers("verified", "prefill-a", "decode-b") + ps.pairTransfers("verified", "prefill-b", "decode-a") +
			ps.pairTransfers("recomputed", "prefill-a", "decode-b") + ps.pairTransfers("recomputed", "prefill-b", "decode-a"); x != 0 {
			t.Fatalf("%v transfers counted on cross-revision pairs", x)
		}
		if r := ps.counter("tandem_pd_transfer_total", map[string]string{"result": "recomputed"}); r != 0 {
			t.Fatalf("%v transfers recomputed in a pool whose pairs never cross revisions", r)
		}
		if v := ps.pairTransfers("verified", "prefill-a", "decode-a") + ps.pairTransfers("verified", "prefill-b", "decode-b"); v != float64(n) {
			t.Fatalf("%v of %d transfers verified", v, n)
		}
		t.Logf("%d requests: decode-a %d, decode-b %d PD requests, all within their revision and verified", n, pdRequests(decodeA), pdRequests(decodeB))
	})

	t.Run("caught", func(t *testing.T) {
		ps, _ := revisionStack(t, eppEnv(map[string]string{"TANDEM_PAIR_MATCH_LABELS": "none"}), false)
		ctx, cancel := context.WithTimeout(context.Background(), 4*waitLimit)
		defer cancel()
		decodeB := ps.decodes[1]
		i := 0
		detected := false
		for ; i < 60 && !detected; i++ {
			ps.ask(ctx, i, i%2 == 0, nil)
			detected = ps.pairTransfers("recomputed", "prefill-a", "decode-b") >= 2
		}
		cross := pdRequests(decodeB)
		recomputed, unknown := ps.pairTransfers("recomputed", "prefill-a", "decode-b"), ps.pairTransfers("unknown", "prefill-a", "decode-b")
		if !detected {
			t.Fatalf("never detected: decode-b served %d cross-revision PD requests, %v counted recomputed, %v unknown", cross, recomputed, unknown)
		}
		if crossPDRequests(decodeB, "b") != cross {
			t.Fatalf("decode-b got %d PD requests, %d of them with revision a's KV: the skew was not what the test set up", cross, crossPDRequests(decodeB, "b"))
		}
		// A cross pair never verifies. Before any pod of the model has shown that it reports
		// cached tokens (vLLM leaves them out when there are none), an answer without them is
		// unknown: the first cross requests may be.
		if v := ps.pairTransfers("verified", "prefill-a", "decode-b"); v != 0 || recomputed+unknown != float64(cross) {
			t.Fatalf("decode-b's %d cross-revision transfers: %v verified, %v recomputed, %v unknown", cross, v, recomputed, unknown)
		}
		if judged := cross - int(unknown); judged > 3 {
			t.Fatalf("detected only after decode-b's %d-th judged cross-revision PD request, want within 3", judged)
		}
		if r := ps.pairTransfers("recomputed", "prefill-a", "decode-a") + ps.pairTransfers("unknown", "prefill-a", "decode-a"); r != 0 {
			t.Fatalf("the same-revision pair counted %v unverified transfers", r)
		}

		// Held out: the next requests all go to the same-revision pair, succeed and verify.
		verified := ps.pairTransfers("verified", "prefill-a", "decode-a")
		const after = 20
		for j := 0; j < after; j, i = j+1, i+1 {
			ps.ask(ctx, i, i%2 == 0, nil)
		}
		if extra := pdRequests(decodeB) - cross; extra != 0 {
			t.Fatalf("decode-b received %d PD requests after it was caught", extra)
		}
		if v := ps.pairTransfers("verified", "prefill-a", "decode-a") - verified; v != after {
			t.Fatalf("decode-a verified %v of the %d requests sent after decode-b was caught", v, after)
		}
		t.Logf("caught after %d cross-revision PD requests (%v unknown; %d requests in all); decode-a then served %d, decode-b none", cross, unknown, i-after, after)
	})
}
