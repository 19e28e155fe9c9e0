package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/demo"
)

// TestRecomputeDetectedOnLLMDSimulator runs the transfer proof against llm-d's vLLM simulator:
// one prefill pod and two decode pods of one roleset behind Tandem and the gateway, in the epp
// hand-off (Tandem runs the prefill leg) and behind llm-d's own routing sidecar (pd-sidecar, on
// the decode pods: it runs the prefill leg, Tandem sees only the decode answer). llm-d's
// simulator has no KV connector to break, and its usage counts only its own prefix-cache hits
// as cached tokens, never the transferred KV; so a healthy pod's usage proves nothing, and must
// not be taken for a recompute. The broken decode pod shows what a recompute looks like from
// outside: its "transfer" takes as long as a local prefill of the prompt, so its first token
// comes as late as if it had computed the prompt itself. It must be caught by timing on every
// streamed PD request it serves (behind the sidecar, every one once Tandem's models know the
// prefill pod's time), and receive at most 3 of them, while the healthy pod counts no recompute.
func TestRecomputeDetectedOnLLMDSimulator(t *testing.T) {
	t.Run("epp", func(t *testing.T) { recomputeOnLLMDSimulator(t, "") })
	t.Run("pd-sidecar", func(t *testing.T) {
		sidecar := os.Getenv("TANDEM_LLMD_SIDECAR")
		if sidecar == "" {
			t.Skip("TANDEM_LLMD_SIDECAR unset: hack/test.sh sets it from hack/ensure-llmd-epp.sh (llm-d's routing sidecar, built from the Go module proxy)")
		}
		recomputeOnLLMDSimulator(t, sidecar)
	})
}

// recomputeOnLLMDSimulator runs the test; sidecar is llm-d's routing sidecar binary ("": the
// epp hand-off).
func recomputeOnLLMDSimulator(t *testing.T, sidecar string) {
	sim := simBinary(t)
	root, err := demo.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bins, err := buildTandem(ctx, root, dir)
	if err != nil {
		t.Fatal(err)
	}
	bins.sim, bins.sidecar = sim, sidecar
	// Prefills long enough for timing to tell (Tandem judges by timing only prefills of 200 ms
	// or more): 300 ms + 50 µs per token. The healthy decode pod pulls KV at 200k tokens/s;
	// the broken one at 2k tokens/s, slower than a prefill of the same prompt.
	e := defaultEngine
	e.prefillOverhead, e.prefillStd, e.timeFactor = 300*time.Millisecond, time.Millisecond, 1
	e.itl, e.itlStd = 2*time.Millisecond, 300*time.Microsecond
	broken := e
	broken.kvPerToken = 500 * time.Microsecond
	const brokenPod, healthyPod = "rs0-decode-1", "rs0-decode-0"
	pods, err := startPods(ctx, dir, bins, shape{rolesets: 1, prefill: 1, decode: 2}, e, map[string]engine{brokenPod: broken}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stopPods(pods)
	poolFile := filepath.Join(dir, "pool.yaml")
	if err := writePool(poolFile, pods); err != nil {
		t.Fatal(err)
	}
	tan, err := startTandem(ctx, dir, bins, poolFile, "proof", "pd")
	if err != nil {
		t.Fatal(err)
	}
	defer tan.stop()
	byName := map[string]*pod{}
	for _, p := range pods {
		byName[p.name] = p
	}
	// The router's readiness request (startTandem's, one token, not streamed: no timing) may
	// have gone to the broken pod; what it serves from here on is the test's streamed requests.
	before, err := byName[brokenPod].served(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Sequential streamed requests of 1,000 prompt words (the simulator's dummy tokenizer:
	// about a token each): a stream's first byte is its first token, what timing reads.
	prompt := strings.TrimSpace(strings.Repeat("word ", 1000))
	const n = 24
	send := func(i int) error {
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`, modelName, fmt.Sprintf("%d %s", i, prompt))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tan.url+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("request %d: %s: %s", i, resp.Status, b)
		}
		return nil
	}
	// Two at a time, so both decode pods get work until one is held out.
	var brokenAt []float64 // the broken pod's served count after each pair
	for i := 0; i < n; i += 2 {
		errs := make(chan error, 2)
		go func() { errs <- send(i) }()
		go func() { errs <- send(i + 1) }()
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		served, err := byName[brokenPod].served(ctx)
		if err != nil {
			t.Fatal(err)
		}
		brokenAt = append(brokenAt, served)
	}
	verdicts, err := transferVerdicts(tan.metrics)
	if err != nil {
		t.Fatal(err)
	}
	healthyServed, err := byName[healthyPod].served(ctx)
	if err != nil {
		t.Fatal(err)
	}
	brokenServed := brokenAt[len(brokenAt)-1]
	t.Logf("verdicts %v; the broken pod served %.0f (after each request: %v), the healthy one %.0f", verdicts, brokenServed, brokenAt, healthyServed)
	brokenKey, healthyKey := brokenPod, healthyPod // demo.ScrapeTransfers names pods without their namespace
	if got := verdicts[healthyKey]["recomputed"]; got != 0 {
		t.Errorf("the healthy decode pod was judged recomputed %v times; want 0 (its usage counts no transferred tokens: that proves nothing)", got)
	}
	// Every streamed PD request the broken pod served was judged recomputed, and it served at
	// most 3 of them: held out after 2 of its last 3, and the back-off, 30 s, outlasts the test.
	// Behind the sidecar Tandem does not see the prefill leg: it compares the first token with
	// the prefill pod's time, which its models learn from the engine's prefill-time histogram,
	// scraped once a second; the first request may come before that (unknown).
	learning := 0.0
	if sidecar != "" {
		learning = 1
	}
	streamed := brokenServed - before
	if got := verdicts[brokenKey]["recomputed"]; streamed < 1 || got < 1 || got < streamed-learning {
		t.Errorf("the broken decode pod was judged recomputed %v times of the %.0f streamed requests it served; want every one but %.0f, at least one", got, streamed, learning)
	}
	if streamed > 3 || brokenServed+healthyServed < n {
		t.Errorf("the broken decode pod served %.0f streamed requests and the healthy one %.0f requests of %d; want at most 3 on the broken one", streamed, healthyServed, n)
	}
}

// transferVerdicts is tandem_pd_transfer_total per decode pod and result.
func transferVerdicts(metricsURL string) (map[string]map[string]float64, error) {
	ts, err := demo.ScrapeTransfers(metricsURL)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]float64{}
	for _, x := range ts {
		if out[x.Decode] == nil {
			out[x.Decode] = map[string]float64{}
		}
		out[x.Decode][x.Result] += x.Count
	}
	return out, nil
}
