package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/sim"
)

// summary is one cell's numbers over its measured requests (warm-up and cool-down left
// out); times in seconds.
type summary struct {
	n, failed                  int
	ttftP50, ttftP90, ttftP99  float64
	queueP50, queueP99         float64 // queueing delay: TTFT minus the request's idle-pod TTFT
	slowP50, slowP99           float64 // slowdown: TTFT over the idle-pod TTFT
	tpotP50, tpotP99, e2eP99   float64
	goodput                    float64 // requests/s meeting both SLOs, over the measurement window
	sloPct                     float64 // share of requests meeting both SLOs
	pdShare, combShare, single float64
	preempted                  int     // requests that lost their KV at least once
	minTTFTMinusPrefill        float64 // sanity: never negative
	// work split: share of prefills computed on prefill / decode / standard pods, share of
	// decodes on decode / standard pods, and the busy share of each pod class
	prefillOn, decodeOn map[string]float64
	util                map[string]float64
}

// pct is the nearest-rank percentile of sorted xs.
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

func summarize(res *runResult) (summary, []float64) {
	s := summary{prefillOn: map[string]float64{}, decodeOn: map[string]float64{}, util: map[string]float64{}}
	var ttft, tpot, e2e, queue, slow []float64
	good := 0
	s.minTTFTMinusPrefill = math.Inf(1)
	for i := range res.recs {
		r := &res.recs[i]
		if !r.measured {
			continue
		}
		s.n++
		if r.failed != "" {
			s.failed++
			continue
		}
		ttft = append(ttft, r.ttft())
		e2e = append(e2e, r.e2e())
		queue = append(queue, r.queueing())
		slow = append(slow, r.slowdown())
		if r.out > 1 {
			tpot = append(tpot, r.tpot())
		}
		switch r.outcome {
		case picker.OutcomePD:
			s.pdShare++
		case picker.OutcomeCombined:
			s.combShare++
		default:
			s.single++
		}
		if r.preempt > 0 {
			s.preempted++
		}
		s.prefillOn[r.prefillOn]++
		s.decodeOn[r.decodeOn]++
		s.minTTFTMinusPrefill = min(s.minTTFTMinusPrefill, r.ttft()-r.prefillC)
		if r.good() {
			good++
		}
	}
	for _, xs := range [][]float64{ttft, tpot, e2e, queue, slow} {
		slices.Sort(xs)
	}
	s.ttftP50, s.ttftP90, s.ttftP99 = pct(ttft, 50), pct(ttft, 90), pct(ttft, 99)
	s.queueP50, s.queueP99 = pct(queue, 50), pct(queue, 99)
	s.slowP50, s.slowP99 = pct(slow, 50), pct(slow, 99)
	s.tpotP50, s.tpotP99 = pct(tpot, 50), pct(tpot, 99)
	s.e2eP99 = pct(e2e, 99)
	if res.span > 0 {
		s.goodput = float64(good) / res.span
	}
	if ok := s.n - s.failed; ok > 0 {
		s.pdShare /= float64(ok)
		s.combShare /= float64(ok)
		s.single /= float64(ok)
		for k := range s.prefillOn {
			s.prefillOn[k] /= float64(ok)
		}
		for k := range s.decodeOn {
			s.decodeOn[k] /= float64(ok)
		}
	}
	for k, b := range res.busy {
		if n := res.pods[k]; n > 0 && res.length > 0 {
			s.util[k] = b / (float64(n) * res.length)
		}
	}
	s.sloPct = float64(good) / float64(max(1, s.n))
	return s, ttft
}

// spread is "[min–max]" of a statistic over a cell's repetitions.
func spread(c *cell, f func(summary) float64, format func(float64) string) string {
	if len(c.reps) < 2 {
		return ""
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range c.reps {
		lo, hi = min(lo, f(r)), max(hi, f(r))
	}
	return " [" + format(lo) + "–" + format(hi) + "]"
}

type wlInfo struct {
	w         *workload
	cluster   string
	capacity  float64
	traceRate float64
}

type report struct {
	o          *options
	started    time.Time
	elapsed    time.Duration
	loadStart  string // the machine's load averages at the start and the end
	loadEnd    string
	capacity   []*capResult
	validation []*validation
	workloads  []wlInfo
	cells      []cell
}

func ms(s float64) string {
	if math.IsNaN(s) {
		return "–"
	}
	return fmt.Sprintf("%.0f", s*1000)
}

// resultLoad is the load the RESULT lines and the headline compare at: 100 % of capacity.
const resultLoad = 1.0

func (r *report) find(wl, cluster, pol string, load float64) *cell {
	for i := range r.cells {
		c := &r.cells[i]
		if c.workload == wl && c.cluster == cluster && c.policy == pol && c.load == load && c.skipped == "" {
			return c
		}
	}
	return nil
}

// productionPolicy is true for the policies the production picker provides (every strategy
// and PD configuration a user can set); the bench's own round-robin never counts.
func productionPolicy(name string) bool {
	for _, p := range allPolicies {
		if p.name == name {
			return !p.rr
		}
	}
	return false
}

// modelNumbers are the engine model's own figures, measured through the scheduling core:
// one prompt of 8192 and of 131072 tokens on an idle pod (seconds to its first token), and
// one decode iteration of 32 sequences each attending to 8192 tokens (ms).
func modelNumbers(p sim.Params) (prefill8k, prefill128k, tpot32 float64) {
	prefill := func(n int) float64 {
		b := sim.NewBatch(p)
		s := &sim.Seq{Prompt: n, Out: 1}
		b.Add(s)
		for s.Generated() == 0 {
			if _, _, ok := b.Plan(); !ok {
				return math.NaN()
			}
			b.Commit()
		}
		return s.PrefillSeconds()
	}
	b := sim.NewBatch(p)
	for i := 0; i < 32; i++ {
		s := &sim.Seq{Kind: sim.SeqDecode, Prompt: 8192, Out: 3}
		b.Add(s)
		b.Ready(s)
	}
	secs := 0.0
	for i := 0; i < 2; i++ { // the first step computes each prompt's last token; the second decodes at 8192
		_, secs, _ = b.Plan()
		b.Commit()
	}
	return prefill(8192), prefill(131072), secs * 1000
}

// fittedTo says, per profile, what published figures the model's own numbers rest on
// (internal/sim/README.md has the sources and the arithmetic).
var fittedTo = map[string][3]string{
	"llama8b-h100": {
		"dense layers at 55 % of the H100's 989 TFLOP/s (NVIDIA NIM, Llama-3.3-70B FP8 on 2×H100: 5000 tokens in 407 ms, ≈ 46 % of peak with TP)",
		"attention at 35 % of peak (FlashAttention-2 on H100, FlashAttention-3 paper); MInference: 1M tokens in 30 min with an 8B model on an A100; issue 17: ~15–20 s on an H100",
		"HBM at 77 % of 3.35 TB/s (vLLM sweep, Llama-3.1-8B BF16 on an A100 40 GB: 75 tokens/s at concurrency 1, ~77 % of the bandwidth ceiling); 16.06 GB of weights + 32 × 8192 × 128 KiB of KV",
	},
}

// headline is one workload's verdict on the default shape: each production policy's gain
// (the smaller of its p99 TTFT cuts against least_request at 80 % and 100 % load) and its
// goodput ratios; it qualifies only with goodput at least least_request's at both loads.
type headline struct {
	policy      string
	cut80, cut1 float64
	g80, g1     float64 // goodput ratios against least_request
	gain        float64
	qualifies   bool
}

func (r *report) headlines(wl, cluster string) ([]headline, bool) {
	lr80, lr1 := r.find(wl, cluster, "least_request", 0.8), r.find(wl, cluster, "least_request", resultLoad)
	if lr80 == nil || lr1 == nil {
		return nil, false
	}
	var out []headline
	for _, p := range r.o.policies {
		c80, c1 := r.find(wl, cluster, p.name, 0.8), r.find(wl, cluster, p.name, resultLoad)
		if !productionPolicy(p.name) || c80 == nil || c1 == nil {
			continue
		}
		h := headline{policy: p.name, cut80: 1 - c80.s.ttftP99/lr80.s.ttftP99, cut1: 1 - c1.s.ttftP99/lr1.s.ttftP99,
			g80: c80.s.goodput / lr80.s.goodput, g1: c1.s.goodput / lr1.s.goodput}
		h.gain = min(h.cut80, h.cut1)
		h.qualifies = c80.s.goodput >= lr80.s.goodput && c1.s.goodput >= lr1.s.goodput
		out = append(out, h)
	}
	return out, true
}

// best is the qualifying policy with the largest gain; least_request itself qualifies with
// gain 0, so when no other policy beats it the headline is 0 at a goodput ratio of 1.
func best(hs []headline) headline {
	b := headline{policy: "least_request", g80: 1, g1: 1, qualifies: true}
	for _, h := range hs {
		if h.qualifies && h.gain > b.gain {
			b = h
		}
	}
	return b
}

func (r *report) write(stdout io.Writer) error {
	var md strings.Builder
	host, _ := os.Hostname()
	cmd := "`go run ./bench/quality` (`make bench-quality`)"
	if r.o.args != "" {
		cmd = "`go run ./bench/quality " + r.o.args + "`"
	}
	fmt.Fprintf(&md, "# Routing quality — results\n\nGenerated by %s (seed %d) on %s, %s/%s, %d CPUs, %s, in %s (load average %s at the start, %s at the end).\n\n",
		cmd, r.o.seed, host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), r.started.UTC().Format("2006-01-02 15:04 MST"), r.elapsed.Round(time.Second), r.loadStart, r.loadEnd)
	p8, p128, tp := modelNumbers(r.o.params)
	fmt.Fprintf(&md, "**Engine model:** profile `%s` (internal/sim/README.md gives every parameter's source). "+
		"One 8192-token prompt on an idle pod: %.3f s; one 131072-token prompt: %.2f s; one decode iteration of 32 sequences with 8192 tokens of context each: %.1f ms.\n\n",
		r.o.profile, p8, p128, tp)
	if f, ok := fittedTo[r.o.profile]; ok {
		fmt.Fprintf(&md, "Fitted to: 8192-token prefill — %s; 131072-token prefill — %s; decode — %s.\n\n", f[0], f[1], f[2])
	}
	fmt.Fprintf(&md, "**Load:** each repetition replays a different window of the trace (Azure windows shuffled, so the mix of sizes is steady; Mooncake in order, for its prefix sharing) "+
		"as a Poisson process at the cell's rate; capacity is the highest such rate the cluster sustains under %s (queues do not grow over the run). "+
		"**Statistics:** the first and last 10 %% of each repetition's arrivals (warm-up, cool-down) are left out; %d repetitions are pooled; `[a–b]` is the range over repetitions.\n\n",
		capacityPolicy, r.o.reps)
	fmt.Fprintf(&md, "**SLO**, per request (sent as `%s` / `%s`): TTFT ≤ max(%.0f s, %.0f× the request's own prefill time on an idle pod) and TPOT ≤ %.0f ms. "+
		"Goodput = measured requests meeting both ÷ the measurement window (req/s). Queueing = TTFT − the request's own idle-pod TTFT; slowdown = TTFT ÷ it. "+
		"Times in ms. PD/comb = share routed as a prefill/decode pair / to a combined (standard) pod (the rest went whole to one pod). "+
		"Prefill on / decode on = share of requests whose prefill (decode) ran on prefill / decode / standard pods; busy = share of time the pods of each class ran iterations.\n\n",
		headerSLOTTFT, headerSLOTPOT, r.o.slo.ttft, r.o.slo.ttftPrefill, r.o.slo.tpot*1000)
	if len(r.validation) > 0 {
		md.WriteString("## Engine model check against the real-time simulator\n\n")
	}
	for _, v := range r.validation {
		md.WriteString(v.markdown())
	}
	fmt.Fprintf(&md, "## Policies\n\n")
	for _, p := range r.o.policies {
		tag := ""
		if !productionPolicy(p.name) {
			tag = " (bench-only: never counts for the headline)"
		}
		fmt.Fprintf(&md, "- **%s**: %s%s\n", p.name, p.describe(), tag)
	}
	md.WriteString("\n")
	var capLines []string
	if len(r.capacity) > 0 {
		capLines = writeCapacity(&md, r.o, r.capacity)
		md.WriteString("\n")
	}
	results := []string{
		fmt.Sprintf("RESULT model_prefill_s_8192=%.3f", p8),
		fmt.Sprintf("RESULT model_prefill_s_131072=%.2f", p128),
		fmt.Sprintf("RESULT model_tpot_ms_batch32_ctx8192=%.1f", tp),
	}

	var notes []string
	split := func(m map[string]float64, keys ...string) string {
		var xs []string
		for _, k := range keys {
			xs = append(xs, fmt.Sprintf("%.0f", m[k]*100))
		}
		return strings.Join(xs, "/")
	}
	for _, wi := range r.workloads {
		w := wi.w
		order := "shuffled"
		if !w.shuffled {
			order = "in trace order"
		}
		fmt.Fprintf(&md, "## %s on %s\n\n%d requests per repetition (windows 0–%d of `%s`, %s", w.name, wi.cluster, len(w.reqs), r.o.reps-1, w.source, order)
		if w.dropped > 0 {
			fmt.Fprintf(&md, "; %d requests longer than one pod's KV capacity skipped", w.dropped)
		}
		fmt.Fprintf(&md, "), trace rate %.2f req/s; capacity %.2f req/s (%s, steady Poisson arrivals).\n\n", wi.traceRate, wi.capacity, capacityPolicy)
		md.WriteString("| load | policy | TTFT p50 | TTFT p90 | TTFT p99 [reps] | queue p50 | queue p99 | slowdown p99 | TPOT p50 | TPOT p99 | E2E p99 | goodput [reps] | SLO % | PD | comb | prefill on P/D/S % | decode on D/S % | busy P/D/S % | preempted | n |\n" +
			"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		var skipped []string
		for _, l := range r.o.loads {
			for _, p := range r.o.policies {
				var c *cell
				for i := range r.cells {
					x := &r.cells[i]
					if x.workload == w.name && x.cluster == wi.cluster && x.policy == p.name && x.load == l {
						c = x
					}
				}
				if c == nil {
					continue
				}
				if c.skipped != "" {
					if l == r.o.loads[0] {
						skipped = append(skipped, fmt.Sprintf("%s not compared: not registered in this tree (%s)", p.name, c.skipped))
					}
					continue
				}
				s := c.s
				fmt.Fprintf(&md, "| %.0f%% | %s | %s | %s | %s%s | %s | %s | %.1f | %s | %s | %s | %.2f%s | %.0f | %.0f%% | %.0f%% | %s | %s | %s | %d | %d |\n",
					l*100, p.name, ms(s.ttftP50), ms(s.ttftP90), ms(s.ttftP99), spread(c, func(x summary) float64 { return x.ttftP99 }, ms),
					ms(s.queueP50), ms(s.queueP99), s.slowP99, ms(s.tpotP50), ms(s.tpotP99), ms(s.e2eP99),
					s.goodput, spread(c, func(x summary) float64 { return x.goodput }, func(v float64) string { return fmt.Sprintf("%.2f", v) }),
					s.sloPct*100, s.pdShare*100, s.combShare*100,
					split(s.prefillOn, "prefill", "decode", "standard"), split(s.decodeOn, "decode", "standard"), split(s.util, "prefill", "decode", "standard"),
					s.preempted, s.n)
			}
		}
		for _, p := range r.o.policies {
			if !p.bucket {
				continue
			}
			if c := r.find(w.name, wi.cluster, p.name, resultLoad); c != nil && c.bucketSteps == 0 {
				why := "the planner did not band any prompt length"
				if strings.HasPrefix(wi.cluster, "1x") {
					why = "with a single roleset there is nothing to band"
				}
				skipped = append(skipped, fmt.Sprintf("%s ran, but bucket serving never narrowed a pick (no `bucket_serve` step: %s), so it differs from its base policy only by prompt-length bucketing", p.name, why))
			}
		}
		for _, s := range skipped {
			fmt.Fprintf(&md, "\nNote: %s.\n", s)
		}
		md.WriteString("\n")
		if hs, ok := r.headlines(w.name, wi.cluster); ok {
			md.WriteString("Against least_request at 80 % and 100 % load (gain = the smaller p99 TTFT cut; qualifies with goodput ≥ least_request's at both):\n\n" +
				"| policy | p99 cut 80 % | p99 cut 100 % | goodput ratio 80 % | goodput ratio 100 % | gain | qualifies |\n|---|---|---|---|---|---|---|\n")
			for _, h := range hs {
				fmt.Fprintf(&md, "| %s | %+.0f%% | %+.0f%% | %.2f | %.2f | %+.3f | %v |\n", h.policy, h.cut80*100, h.cut1*100, h.g80, h.g1, h.gain, h.qualifies)
			}
			b := best(hs)
			verdict := fmt.Sprintf("best qualifying: **%s** (gain %.3f, goodput ratio %.2f)", b.policy, b.gain, min(b.g80, b.g1))
			if b.policy == "least_request" {
				verdict = "no policy qualifies with a positive gain: least_request stays the best (gain 0, ratio 1)"
			}
			fmt.Fprintf(&md, "\n%s on %s: %s.\n", w.name, wi.cluster, verdict)
			for _, h := range hs {
				if r.predictive(h.policy) {
					results = append(results, fmt.Sprintf("RESULT ttft_p99_gain_vs_least_request_%s_%s_%s=%.3f", w.name, wi.cluster, h.policy, h.gain))
					results = append(results, fmt.Sprintf("RESULT goodput_ratio_vs_least_request_%s_%s_%s=%.3f", w.name, wi.cluster, h.policy, min(h.g80, h.g1)))
				}
			}
			if wi.cluster == r.o.clusters[0].name {
				results = append(results, fmt.Sprintf("RESULT ttft_p99_gain_vs_least_request_%s=%.3f", w.name, b.gain))
				results = append(results, fmt.Sprintf("RESULT goodput_ratio_best_vs_least_request_%s=%.3f", w.name, min(b.g80, b.g1)))
				notes = append(notes, fmt.Sprintf("headline %s: %s", w.name, verdict))
			}
		}
		if wi.cluster == r.o.clusters[0].name {
			for _, p := range r.o.policies {
				if c := r.find(w.name, wi.cluster, p.name, resultLoad); c != nil {
					results = append(results, fmt.Sprintf("RESULT ttft_p99_ms_%s_%s=%.0f", w.name, p.name, c.s.ttftP99*1000))
					results = append(results, fmt.Sprintf("RESULT goodput_%s_%s=%.3f", w.name, p.name, c.s.goodput))
				}
			}
		}
		if pe := r.predictionErrors(w.name, wi.cluster); len(pe) > 0 {
			md.WriteString("\nHow far the latency models' TTFT predictions were from the TTFTs the gateway observed (every request of every repetition, warm-up included; " +
				"ratio = observed ÷ predicted, > 1: predicted too low):\n\n" +
				"| load | policy | predictions | mean abs. error ÷ observed | ratio geo. mean | ratio p10 | ratio p50 | ratio p90 |\n|---|---|---|---|---|---|---|---|\n")
			for _, e := range pe {
				fmt.Fprintf(&md, "| %.0f%% | %s | %d | %.0f%% | %.2f | %.2f | %.2f | %.2f |\n", e.load*100, e.policy, e.N, e.MeanAbsRel*100, e.Bias, e.RatioP10, e.RatioP50, e.RatioP90)
				if e.load == resultLoad {
					results = append(results, fmt.Sprintf("RESULT ttft_prediction_abs_rel_error_%s_%s_%s=%.3f", w.name, wi.cluster, e.policy, e.MeanAbsRel))
					results = append(results, fmt.Sprintf("RESULT ttft_prediction_ratio_p50_%s_%s_%s=%.2f", w.name, wi.cluster, e.policy, e.RatioP50))
				}
			}
		}
		if err := r.pictures(&md, wi); err != nil {
			return err
		}
		md.WriteString("\n")
	}
	if len(capLines) > 0 {
		fmt.Fprintf(&md, "\n## RESULT lines: capacity against the best baseline\n\n```\n%s\n```\n", strings.Join(capLines, "\n"))
	}
	fmt.Fprintf(&md, "\n## RESULT lines (cluster %s)\n\n```\n%s\n```\n", r.o.clusters[0].name, strings.Join(results, "\n"))
	mdPath := filepath.Join(r.o.outDir, "quality.md")
	if err := os.WriteFile(mdPath, []byte(md.String()), 0o644); err != nil {
		return err
	}
	if r.o.docsDir != "" {
		if err := os.MkdirAll(r.o.docsDir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(r.o.docsDir, "results.md"), []byte(md.String()), 0o644); err != nil {
			return err
		}
	}
	for _, n := range notes {
		fmt.Fprintln(stdout, n)
	}
	for _, l := range capLines {
		fmt.Fprintln(stdout, l)
	}
	f, fitted := fittedTo[r.o.profile]
	for i, l := range results {
		fmt.Fprintln(stdout, l)
		if fitted && i < len(f) { // the three model lines come first
			fmt.Fprintf(stdout, "#   fitted to: %s\n", f[i])
		}
	}
	fmt.Fprintf(stdout, "wrote %s (total %s)\n", mdPath, r.elapsed.Round(time.Millisecond))
	return nil
}

// predictive is true for a policy whose cells carry the latency models' prediction errors.
func (r *report) predictive(pol string) bool {
	for i := range r.cells {
		if c := &r.cells[i]; c.policy == pol && len(c.pred) > 0 {
			return true
		}
	}
	return false
}

// predError is one cell's prediction error pooled over its repetitions.
type predError struct {
	policy string
	load   float64
	latency.ErrorSummary
}

// predictionErrors pools each predictive cell's repetitions: the mean absolute error and the
// geometric bias weighted by the predictions of each, the percentiles as the median of the
// repetitions' (p10 the lowest, p90 the highest, so the spread is not understated).
func (r *report) predictionErrors(wl, cluster string) []predError {
	var out []predError
	for _, l := range r.o.loads {
		for _, p := range r.o.policies {
			c := r.find(wl, cluster, p.name, l)
			if c == nil || len(c.pred) == 0 {
				continue
			}
			e := predError{policy: p.name, load: l}
			var lnBias float64
			var p50s []float64
			e.RatioP10, e.RatioP90 = math.Inf(1), math.Inf(-1)
			for _, x := range c.pred {
				if x.N == 0 {
					continue
				}
				e.N += x.N
				e.MeanAbsRel += x.MeanAbsRel * float64(x.N)
				lnBias += math.Log(x.Bias) * float64(x.N)
				e.RatioP10, e.RatioP90 = min(e.RatioP10, x.RatioP10), max(e.RatioP90, x.RatioP90)
				p50s = append(p50s, x.RatioP50)
			}
			if e.N == 0 {
				continue
			}
			e.MeanAbsRel /= float64(e.N)
			e.Bias = math.Exp(lnBias / float64(e.N))
			slices.Sort(p50s)
			e.RatioP50 = p50s[len(p50s)/2]
			out = append(out, e)
		}
	}
	return out
}
