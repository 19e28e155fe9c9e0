package e2e

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/sim"
	"github.com/tandem-epp/tandem/internal/wire"
)

// pd-predictive on simulated pods whose speeds differ: two rolesets whose prefill pods are
// one fast and one eight times slower (both start from the same cold-start model), decode
// pods slow at prefill. Tandem runs the prefill legs (EPP hand-off) and learns each pod from
// what it observes — its prefill legs, the first bytes, the chunk gaps — so once it has
// seen a few requests it predicts the fast pod's prefill close to what it takes, sends the
// prefills of a burst there (the slow pod only when the fast one's booked work exceeds the
// slow one's whole prefill), and never runs a prompt on the slow decode pods.
func TestPredictiveLearnsPodSpeeds(t *testing.T) {
	fast := sim.DefaultParams()
	slow := sim.DefaultParams()
	slow.PrefillBase, slow.PrefillPerToken, slow.PrefillQuadratic = 8*fast.PrefillBase, 8*fast.PrefillPerToken, 8*fast.PrefillQuadratic
	const scale = 0.1 // 2000 tokens: 15 ms on the fast pod, 120 ms on the slow ones
	specs := []podSpec{
		{name: "prefill-fast", role: sim.RolePrefill, roleset: "rs-a", params: &fast, scale: scale},
		{name: "decode-a", role: sim.RoleDecode, roleset: "rs-a", params: &slow, scale: scale},
		{name: "prefill-slow", role: sim.RolePrefill, roleset: "rs-b", params: &slow, scale: scale},
		{name: "decode-b", role: sim.RoleDecode, roleset: "rs-b", params: &slow, scale: scale},
	}
	cfg := `{"profiles":{"default":{"routingStrategy":"pd-predictive"}}}`
	for i := range specs {
		specs[i].config = cfg
	}
	s := &stack{t: t, pods: startPods(t, specs...), poolFile: filepath.Join(t.TempDir(), "endpoints.yaml"), client: newClient()}
	var all []*pod
	for _, sp := range specs {
		all = append(all, s.pods[sp.name])
	}
	writePoolFile(t, s.poolFile, all...)
	// The decision trace on every response: its predicted TTFT and the models' recent error.
	s.tandem = startTandem(t, []string{"--endpoints-file=" + s.poolFile, "--debug-trace-header"},
		defaultEnv(map[string]string{"TANDEM_PD_HANDOFF": "epp"}), nil)
	s.gwURL = startGateway(t, s.tandem.ExtProcAddr())
	ctx := testCtx(t, 90*time.Second)
	send := func(marker string, headers map[string]string) reply {
		r := s.post(ctx, "/v1/completions", completionBody(prompt(marker, 2000), 4, true), headers)
		if err := okCompletion(r, true); err != nil {
			t.Fatalf("%s: %v", marker, err)
		}
		return r
	}
	// requests counts what p received for prompts starting with prefix: prefill legs (the
	// hand-off's, kv_transfer_params.do_remote_decode) or whole requests (no kv_transfer_params).
	requests := func(p *pod, prefix string, prefillLegs bool) int {
		n := 0
		for _, r := range p.Requests() {
			b := string(r.Body)
			if !strings.Contains(b, `"`+prefix) {
				continue
			}
			if leg := strings.Contains(b, `"do_remote_decode":true`); leg == prefillLegs && (leg || !strings.Contains(b, "kv_transfer_params")) {
				n++
			}
		}
		return n
	}
	legs := func(p *pod, prefix string) int { return requests(p, prefix, true) }
	var wg sync.WaitGroup
	burst := func(prefix string, bursts, size int, headers map[string]string) {
		for b := range bursts {
			for i := range size {
				wg.Go(func() { send(prefix+strconv.Itoa(b*size+i), headers) })
			}
			wg.Wait()
		}
	}
	// Learning: bursts of 8 while the models are cold, so both prefill pods get prompts (to
	// cold models they look alike: each booking makes the other pod the earlier finish).
	burst("learn-", 3, 8, nil)
	fastLearn, slowLearn := legs(s.pods["prefill-fast"], "learn-"), legs(s.pods["prefill-slow"], "learn-")
	if slowLearn == 0 || fastLearn == 0 {
		t.Fatalf("learning: fast %d, slow %d prefill legs: both pods should have been tried", fastLearn, slowLearn)
	}
	// Bursts of 4 at once: each prefill goes where it is predicted to end first — four on
	// the fast pod (4 × 15 ms) end before one on the slow pod (120 ms). Their TPOT objective
	// is loose, so the pairs are chosen on the prefill side: the two decode pods are alike,
	// but their steps, fitted on chunk gaps a loaded machine's scheduling stretches, can
	// differ by more than the prefills do against a 50 ms objective (a make test run sent
	// every burst to the slow pair while decode-a's predicted TPOT was 47 ms).
	burst("burst-", 6, 4, map[string]string{wire.HeaderSLOTPOT: "1000000"})
	fastN, slowN := legs(s.pods["prefill-fast"], "burst-"), legs(s.pods["prefill-slow"], "burst-")
	local := requests(s.pods["decode-a"], "burst-", false) + requests(s.pods["decode-b"], "burst-", false)
	t.Logf("prefill legs while learning: fast %d, slow %d; in the bursts: fast %d, slow %d, whole on a decode pod %d",
		fastLearn, slowLearn, fastN, slowN, local)
	if fastN < 3*max(slowN, 1) || fastN+slowN+local != 24 {
		t.Errorf("bursts: fast %d, slow %d, local %d prefills: want the fast pod to take at least 3× the slow one's", fastN, slowN, local)
	}
	if local > 2 {
		t.Errorf("%d prompts ran on the decode pods, 8× slower at prefill", local)
	}

	// An idle cluster: the prediction of one request against what the client sees. Its TPOT
	// objective is loose, so the pair is chosen by predicted TTFT alone: the decode pods'
	// steps, fitted on chunk gaps that a loaded machine's scheduling stretches, do not weigh.
	start := time.Now()
	r := s.post(ctx, "/v1/completions", completionBody(prompt("final", 2000), 4, true), map[string]string{wire.HeaderSLOTPOT: "1000000"})
	elapsed := time.Since(start)
	if err := okCompletion(r, true); err != nil {
		t.Fatalf("final: %v", err)
	}
	var trace struct {
		Scores map[string]string `json:"scores"`
	}
	if err := json.Unmarshal([]byte(r.header.Get("X-Tandem-Trace")), &trace); err != nil {
		t.Fatalf("trace %q: %v", r.header.Get("X-Tandem-Trace"), err)
	}
	predicted, err := strconv.ParseFloat(trace.Scores["predicted_ttft_ms"], 64)
	if err != nil {
		t.Fatalf("trace scores %v", trace.Scores)
	}
	// The fast pod's prefill is 15 ms here; cold, the model predicted 0.01 + 2000 × 5e-5 +
	// attention = 0.15 s (the default coefficients, for a pod ten times slower than this one).
	// The prefill pod's score is its predicted prefill end (nothing is booked on an idle
	// cluster); the whole TTFT adds the decode pod's hand-over as Tandem observed it on this
	// machine (KV pull, first step, the gateway's and the pods' scheduling).
	prefillS := -1.0
	for k, v := range trace.Scores {
		if strings.HasPrefix(k, "prefill ") && strings.Contains(k, "prefill-fast") {
			prefillS, _ = strconv.ParseFloat(v, 64)
		}
	}
	if prefillS < 0 || prefillS > 0.075 {
		t.Errorf("predicted prefill %.4f s on the fast pod for a 15 ms prefill (cold: 0.15 s): the model did not learn it; trace %v", prefillS, trace.Scores)
	}
	if predicted > 150 {
		t.Errorf("predicted TTFT %.1f ms on an idle cluster: more than the cold model's prefill alone", predicted)
	}
	// The predictions follow what the gateway observed: the decode pod's recent bias
	// (observed ÷ predicted TTFT, geometric mean over its last few dozen routes) is near 1,
	// however slow this machine made the hand-overs.
	for k, v := range trace.Scores {
		if !strings.HasPrefix(k, "ttft_error ") {
			continue
		}
		_, b, ok := strings.Cut(v, "bias ")
		bias, err := strconv.ParseFloat(b, 64)
		if !ok || err != nil {
			t.Fatalf("trace %s=%q: no bias", k, v)
		}
		if bias < 0.5 || bias > 2 {
			t.Errorf("%s: observed ÷ predicted TTFT %.2f recently: the predictions do not follow the observed TTFTs", k, bias)
		}
	}
	t.Logf("final request: predicted TTFT %.1f ms, the whole answer took %.1f ms at the client", predicted, float64(elapsed.Microseconds())/1000)
	hasError := false
	for k := range trace.Scores {
		hasError = hasError || strings.HasPrefix(k, "ttft_error ")
	}
	if !hasError {
		t.Errorf("trace %v: no prediction error of the pods' models", trace.Scores)
	}
	t.Logf("final request: predicted TTFT %.1f ms; trace %v", predicted, trace.Scores)
	// Tandem's own metrics count each prediction against its outcome.
	eventually(t, "tandem_ttft_prediction_ratio observations", func() (bool, string) {
		fams, err := tandemMetrics(s.tandem.MetricsAddr())
		if err != nil {
			return false, err.Error()
		}
		f := fams["tandem_ttft_prediction_ratio"]
		if f == nil || len(f.GetMetric()) == 0 {
			return false, "no family"
		}
		n := uint64(0)
		for _, m := range f.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
		}
		return n >= 40, strconv.FormatUint(n, 10) + " observations"
	})
}
