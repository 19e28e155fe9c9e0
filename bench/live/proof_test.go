package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/demo"
)

// TestRecomputeDetectedOnLLMDSimulator runs the transfer proof against llm-d's vLLM simulator:
// one prefill pod and two decode pods of one roleset behind Tandem and the gateway, in the epp
// hand-off (Tandem runs the prefill leg) and behind llm-d's own routing sidecar (pd-sidecar, on
// the decode pods: it runs the prefill leg, Tandem sees only the decode answer), under each
// policy. llm-d's simulator has no KV connector to break, and its usage counts only its own
// prefix-cache hits as cached tokens, never the transferred KV; so a healthy pod's usage proves
// nothing, and must not be taken for a recompute. The broken decode pod shows what a recompute
// looks like from outside: its "transfer" takes as long as a local prefill of the prompt, so its
// first token comes as late as if it had computed the prompt itself.
//
// Lenient: the broken pod is caught by timing on every streamed PD request it serves (behind
// the sidecar, every one once Tandem's models know the prefill pod's time) and receives at most
// 3 of them, while the healthy pod counts no recompute. Strict: no answer the broken pod served
// reaches its client whole; in the epp hand-off the healthy pod's are verified by timing (its
// first token comes long before a prefill could end; the first ones, before Tandem knows the
// prefill pod's time, are unverifiable and refused) and served, while behind the sidecar, where
// timing cannot verify, they are unverifiable and refused too.
func TestRecomputeDetectedOnLLMDSimulator(t *testing.T) {
	sidecar := os.Getenv("TANDEM_LLMD_SIDECAR")
	for _, c := range []struct {
		name, sidecar string
		strict        bool
	}{{"epp", "", false}, {"epp-strict", "", true}, {"pd-sidecar", sidecar, false}, {"pd-sidecar-strict", sidecar, true}} {
		t.Run(c.name, func(t *testing.T) {
			if strings.HasPrefix(c.name, "pd-sidecar") && sidecar == "" {
				t.Skip("TANDEM_LLMD_SIDECAR unset: hack/test.sh sets it from hack/ensure-llmd-epp.sh (llm-d's routing sidecar, built from the Go module proxy)")
			}
			recomputeOnLLMDSimulator(t, c.sidecar, c.strict)
		})
	}
}

// The proof stacks' decode pods: the broken one (when there is one) and the healthy one.
const brokenPod, healthyPod = "rs0-decode-1", "rs0-decode-0"

// startProofStack runs one prefill pod and two decode pods of llm-d's simulator behind Tandem
// (strategy, transfer-proof policy) and the gateway until the test ends; sidecar is llm-d's
// routing sidecar binary ("": the epp hand-off). Prefills are long enough for timing to tell
// (Tandem judges by timing only prefills of 200 ms or more): 300 ms + 50 µs per token. The
// decode pods pull KV at 200k tokens/s; with broken, rs0-decode-1 at 2k tokens/s, slower than
// a prefill of the same prompt. tune may change the prefill and the decode pods' engines.
func startProofStack(ctx context.Context, t *testing.T, sidecar, strategy, policy string, broken bool, tune func(prefill, decode *engine)) (*tandem, map[string]*pod) {
	t.Helper()
	root, err := demo.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bins, err := buildTandem(ctx, root, dir)
	if err != nil {
		t.Fatal(err)
	}
	bins.sim, bins.sidecar = simBinary(t), sidecar
	e := defaultEngine
	e.prefillOverhead, e.prefillStd, e.timeFactor = 300*time.Millisecond, time.Millisecond, 1
	e.itl, e.itlStd = 2*time.Millisecond, 300*time.Microsecond
	pre, dec := e, e
	if tune != nil {
		tune(&pre, &dec)
	}
	override := map[string]engine{"rs0-prefill-0": pre, healthyPod: dec, brokenPod: dec}
	if broken {
		b := dec
		b.kvPerToken = 500 * time.Microsecond
		override[brokenPod] = b
	}
	pods, err := startPods(ctx, dir, bins, shape{rolesets: 1, prefill: 1, decode: 2}, e, override, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopPods(pods) })
	poolFile := filepath.Join(dir, "pool.yaml")
	if err := writePool(poolFile, pods); err != nil {
		t.Fatal(err)
	}
	tan, err := startTandem(ctx, dir, bins, poolFile, "proof", strategy, "TANDEM_PD_TRANSFER_PROOF="+policy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tan.stop)
	byName := map[string]*pod{}
	for _, p := range pods {
		byName[p.name] = p
	}
	return tan, byName
}

// streamed sends a streamed completion of a 1,000-word prompt (the simulator's dummy
// tokenizer: about a token each; i makes it unique) with maxTokens of output: a stream's first
// byte is its first token, what timing reads. whole: the client got a complete answer (200 and
// the stream's end).
func streamed(ctx context.Context, url string, i, maxTokens int) (whole bool, detail string, err error) {
	prompt := strings.TrimSpace(strings.Repeat("word ", 1000))
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`, modelName, fmt.Sprintf("%d %s", i, prompt), maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, "", err
	}
	b, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	whole = resp.StatusCode == http.StatusOK && rerr == nil && strings.Contains(string(b), "data: [DONE]")
	return whole, fmt.Sprintf("request %d: %s (%v): %.300s", i, resp.Status, rerr, b), nil
}

// recomputeOnLLMDSimulator runs one case; sidecar is llm-d's routing sidecar binary ("": the
// epp hand-off).
func recomputeOnLLMDSimulator(t *testing.T, sidecar string, strict bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	policy := "lenient"
	if strict {
		policy = "strict"
	}
	tan, byName := startProofStack(ctx, t, sidecar, "pd", policy, true, nil)
	// The router's readiness request (startTandem's, one token, not streamed: no timing) may
	// have gone to either decode pod; what they serve from here on is the test's streamed
	// requests.
	brokenBefore, err := byName[brokenPod].served(ctx)
	if err != nil {
		t.Fatal(err)
	}
	healthyBefore, err := byName[healthyPod].served(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 24
	send := func(i int) (bool, error) {
		whole, detail, err := streamed(ctx, tan.url, i, 4)
		if err == nil && !whole && !strict {
			err = errors.New(detail)
		}
		return whole, err
	}
	// Two at a time, so both decode pods get work until one is held out.
	var brokenAt []float64 // the broken pod's served count after each pair
	wholeAnswers := 0
	for i := 0; i < n; i += 2 {
		type result struct {
			whole bool
			err   error
		}
		res := make(chan result, 2)
		for k := range 2 {
			go func() { w, err := send(i + k); res <- result{w, err} }()
		}
		for range 2 {
			r := <-res
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.whole {
				wholeAnswers++
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
	brokenStreamed, healthyStreamed := brokenAt[len(brokenAt)-1]-brokenBefore, healthyServed-healthyBefore
	t.Logf("%s: verdicts %v; the broken pod served %.0f streamed requests (its count after each pair: %v), the healthy one %.0f; %d answers reached their client whole",
		policy, verdicts, brokenStreamed, brokenAt, healthyStreamed, wholeAnswers)
	brokenKey, healthyKey := brokenPod, healthyPod // demo.ScrapeTransfers names pods without their namespace
	if got := verdicts[healthyKey]["recomputed"]; got != 0 {
		t.Errorf("the healthy decode pod was judged recomputed %v times; want 0 (its usage counts no transferred tokens: that proves nothing)", got)
	}
	if brokenStreamed+healthyStreamed != n {
		t.Fatalf("the decode pods served %.0f + %.0f streamed requests; want %d", brokenStreamed, healthyStreamed, n)
	}
	if strict {
		// Whole answers: the healthy pod's verified by timing (once Tandem's models know the
		// prefill pod's time), none of the broken pod's; behind the sidecar timing cannot
		// verify, so none at all.
		verified := verdicts[healthyKey]["verified"]
		if sidecar != "" && verified != 0 {
			t.Errorf("strict: %v of the healthy pod's transfers verified behind the sidecar, where nothing can verify them", verified)
		}
		if float64(wholeAnswers) != verified || sidecar == "" && verified < healthyStreamed-3 {
			t.Errorf("strict: %d answers reached their client whole; want the %v the healthy pod verified, all but 3 of its %.0f (the broken one served %.0f)",
				wholeAnswers, verified, healthyStreamed, brokenStreamed)
		}
		return
	}
	// Every streamed PD request the broken pod served was judged recomputed, and it served at
	// most 3 of them: held out after 2 of its last 3, and the back-off, 30 s, outlasts the test.
	// Behind the sidecar Tandem does not see the prefill leg: it compares the first token with
	// the prefill pod's time, which its models learn from the engine's prefill-time histogram,
	// scraped once a second, and with the other decode pod's recent requests; the first
	// requests may come before either is known (unknown): caught within its first 3 (at most
	// 2 unknown before the first recompute), held after the next.
	learning := 0.0
	if sidecar != "" {
		learning = 2
	}
	if got := verdicts[brokenKey]["recomputed"]; brokenStreamed < 1 || got < 1 || got < brokenStreamed-learning {
		t.Errorf("the broken decode pod was judged recomputed %v times of the %.0f streamed requests it served; want every one but %.0f, at least one", got, brokenStreamed, learning)
	}
	if limit := 3 + learning/2; brokenStreamed > limit {
		t.Errorf("the broken decode pod served %.0f streamed requests; want at most %.0f", brokenStreamed, limit)
	}
}

// TestProofUnderLoadOnLLMDSimulator: timing under load, where a first token is late for reasons
// other than a recompute. Eight clients at once on llm-d's simulator slowed by load (its time
// factor 6 at 16 running requests): behind llm-d's sidecar with a healthy pool (the prefill pod
// slower than predicted delays every decode pod alike); in the epp hand-off with decode pods
// that run 2 requests at once (their queue delays the first token); and in the epp hand-off
// under strict with a prefill pod that runs one prompt at a time (a leg that queued is no
// prefill's time: a recompute must not pass for a transfer because its first token came within
// half of it). No healthy pod is judged recomputed more than once (never the 2 of 3 that hold
// it), and no broken pod verified.
func TestProofUnderLoadOnLLMDSimulator(t *testing.T) {
	sidecar := os.Getenv("TANDEM_LLMD_SIDECAR")
	for _, c := range []struct {
		name, sidecar, strategy, policy string
		broken                          bool
		tune                            func(prefill, decode *engine)
	}{
		{"pd-sidecar", sidecar, "pd-predictive", "lenient", false, func(p, d *engine) { p.timeFactor, d.timeFactor = 6, 6 }},
		{"epp-decode-queue", "", "pd", "lenient", false, func(p, d *engine) { p.timeFactor, d.timeFactor, d.maxNumSeqs = 6, 6, 2 }},
		{"epp-prefill-queue-strict", "", "pd", "strict", true, func(p, d *engine) { p.maxNumSeqs = 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.sidecar == "" && strings.HasPrefix(c.name, "pd-sidecar") {
				t.Skip("TANDEM_LLMD_SIDECAR unset: hack/test.sh sets it from hack/ensure-llmd-epp.sh (llm-d's routing sidecar, built from the Go module proxy)")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			tan, _ := startProofStack(ctx, t, c.sidecar, c.strategy, c.policy, c.broken, c.tune)
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 6 {
						// Arrivals spread over a tenth of a second, so the load varies.
						time.Sleep(time.Duration((w*37+i*11)%100) * time.Millisecond)
						if _, _, err := streamed(ctx, tan.url, w*100+i, 60); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			verdicts, err := transferVerdicts(tan.metrics)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("verdicts %v", verdicts)
			// A rare request may come late enough for other reasons (measured: 1 of 14 once,
			// on a loaded CI machine), never the 2 of 3 that hold a pod.
			healthy := []string{healthyPod}
			if !c.broken {
				healthy = append(healthy, brokenPod)
			}
			for _, pod := range healthy {
				if got := verdicts[pod]["recomputed"]; got > 1 {
					t.Errorf("the healthy pod %s was judged recomputed %v times", pod, got)
				}
			}
			if got := verdicts[brokenPod]["verified"]; c.broken && got != 0 {
				t.Errorf("the broken pod %s was judged verified %v times", brokenPod, got)
			}
		})
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
