package demo

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// decisionMetrics are the names Tandem has counted its decisions under (the app's telemetry,
// and the picker's own counter).
var decisionMetrics = []string{"tandem_decisions_total{", "tandem_picker_decisions_total{"}

// Decision is one series of Tandem's decision counter.
type Decision struct {
	Strategy, Outcome, Step string
	Count                   float64
}

// ScrapeDecisions reads Tandem's decision counter from its metrics endpoint.
func ScrapeDecisions(url string) ([]Decision, error) { return scrape(url, parseDecisions) }

// scrape reads Tandem's metrics endpoint with parse.
func scrape[T any](url string, parse func(io.Reader) (T, error)) (T, error) {
	var zero T
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return zero, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return zero, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parse(resp.Body)
}

// parseDecisions reads the decision counter's series from Prometheus text format.
func parseDecisions(r io.Reader) ([]Decision, error) {
	var out []Decision
	err := parseSeries(r, decisionMetrics, func(labels map[string]string, v float64) {
		out = append(out, Decision{Strategy: labels["strategy"], Outcome: labels["outcome"], Step: labels["step"], Count: v})
	})
	return out, err
}

// parseSeries calls add with the labels and value of every series in Prometheus text format
// whose line starts with one of names (a metric name and its opening brace).
func parseSeries(r io.Reader, names []string, add func(labels map[string]string, v float64)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var rest string
		var ok bool
		for _, name := range names {
			if rest, ok = strings.CutPrefix(line, name); ok {
				break
			}
		}
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		m := map[string]string{}
		for _, kv := range strings.Split(labels, ",") {
			k, val, _ := strings.Cut(kv, "=")
			m[k] = strings.Trim(val, `"`)
		}
		add(m, v)
	}
	return sc.Err()
}

// percentile returns the q-quantile (nearest rank) of d, which it sorts.
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(math.Ceil(q*float64(len(d)))) - 1
	return d[max(0, min(i, len(d)-1))]
}

func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "—"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// Report prints the summary of a run.
func Report(w io.Writer, st *Stack, results []Result, elapsed time.Duration, decisions []Decision, decisionsErr error) {
	podRole := map[string]string{}
	for _, p := range st.Pods {
		podRole[p.Name] = p.Role
	}
	type group struct {
		n          int
		ttft, itls []time.Duration
	}
	roles := map[string]*group{}
	bySource := map[string]map[string]int{}
	strategies := map[string]int{}
	whyTrace := map[string]int{}
	failures := map[string]int{}
	served := map[string]int{}
	failed := 0
	for _, r := range results {
		src := r.Req.Source
		if bySource[src] == nil {
			bySource[src] = map[string]int{}
		}
		if r.Err != "" {
			failed++
			failures[r.Err]++
			bySource[src]["failed"]++
			continue
		}
		served[r.Pod]++
		role := r.Kind(podRole[r.Pod])
		g := roles[role]
		if g == nil {
			g = &group{}
			roles[role] = g
		}
		g.n++
		g.ttft = append(g.ttft, r.TTFT)
		g.itls = append(g.itls, r.ITLs...)
		bySource[src][role]++
		strategies[r.Strategy]++
		if len(r.Steps) > 0 {
			whyTrace[role+": "+strings.Join(r.Steps, " → ")]++
		}
	}

	fmt.Fprintf(w, "\nTandem demo: %d requests replayed in %.1fs, %d failed.\n", len(results), elapsed.Seconds(), failed)
	fmt.Fprintf(w, "Pods: 2 rolesets (rs-a, rs-b) of 1 prefill + 1 decode each, and 1 standard pod; prompts under %d tokens\n"+
		"belong to the standard pod's bucket, longer ones to the prefill/decode rolesets.\n\n", BucketTokens)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pod role\trequests\tTTFT p50\tTTFT p99\tITL p50\tITL p99\t")
	prefillLegs := 0
	for _, p := range st.Pods {
		if p.Role == "prefill" {
			prefillLegs += received(p)
		}
	}
	for _, role := range []string{KindPD, KindRecomputed, KindDecode, KindCombined, KindPrefill, KindUnknown} {
		g := roles[role]
		if g == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", role, g.n, ms(percentile(g.ttft, .5)), ms(percentile(g.ttft, .99)),
			ms(percentile(g.itls, .5)), ms(percentile(g.itls, .99)))
	}
	fmt.Fprintf(tw, "prefill (legs)\t%d\t—\t—\t—\t—\t\n", prefillLegs)
	tw.Flush()
	fmt.Fprintln(w, "TTFT and ITL are measured by the client through the gateway; a PD request's TTFT includes its prefill leg.")

	count := func(k string) int {
		if g := roles[k]; g != nil {
			return g.n
		}
		return 0
	}
	fmt.Fprintf(w, "\nRouting: %d went PD (decode pod fed by a prefill pod), %d combined (standard pod), %d to a decode pod without a prefill leg.\n",
		count(KindPD), count(KindCombined), count(KindDecode))
	if n := count(KindRecomputed); n > 0 {
		fmt.Fprintf(w, "  and %d went PD to a decode pod whose broken KV connector made it compute the prompt itself (see the proof below).\n", n)
	}
	for _, src := range sortedKeys(bySource) {
		m := bySource[src]
		fmt.Fprintf(w, "  %-24s PD %3d   combined %3d   decode-only %3d   failed %3d\n", src, m[KindPD], m[KindCombined], m[KindDecode], m["failed"])
	}
	var strat []string
	for _, s := range sortedKeys(strategies) {
		name := s
		if name == "" {
			name = "(no routing-strategy header)"
		}
		strat = append(strat, fmt.Sprintf("%s ×%d", name, strategies[s]))
	}
	fmt.Fprintf(w, "  strategy used (routing-strategy response header): %s\n", strings.Join(strat, ", "))
	fmt.Fprintf(w, "  %s\n", handoffLine(results, podRole))

	fmt.Fprintln(w, "\nWhy (Tandem's decision counter tandem_decisions_total: outcome, strategy, deciding step, count):")
	switch {
	case decisionsErr != nil:
		fmt.Fprintf(w, "  metrics not readable (%v)\n", decisionsErr)
	case len(decisions) == 0:
		fmt.Fprintln(w, "  no decision series on Tandem's /metrics")
	}
	sort.Slice(decisions, func(i, j int) bool { return decisions[i].Count > decisions[j].Count })
	for _, d := range decisions {
		fmt.Fprintf(w, "  %-9s %-22s %-30s %5.0f\n", d.Outcome, d.Strategy, d.Step, d.Count)
	}
	if len(whyTrace) > 0 {
		fmt.Fprintln(w, "Decision traces (x-tandem-trace), most frequent:")
		keys := sortedKeys(whyTrace)
		sort.SliceStable(keys, func(i, j int) bool { return whyTrace[keys[i]] > whyTrace[keys[j]] })
		for _, k := range keys[:min(len(keys), 6)] {
			fmt.Fprintf(w, "  %4d × %s\n", whyTrace[k], k)
		}
	}

	fmt.Fprintln(w, "\nPods (client requests served; prefill pods: prefill legs received):")
	for _, p := range st.Pods {
		rs := p.Roleset
		if rs == "" {
			rs = "-"
		}
		n := served[p.Name]
		if p.Role == "prefill" {
			n = received(p)
		}
		fmt.Fprintf(w, "  %-11s %-9s roleset %-5s %s  %d\n", p.Name, p.Role, rs, p.Server.HostPort(), n)
	}
	if failed > 0 {
		fmt.Fprintln(w, "\nFailures:")
		keys := sortedKeys(failures)
		sort.SliceStable(keys, func(i, j int) bool { return failures[keys[i]] > failures[keys[j]] })
		for _, k := range keys[:min(len(keys), 5)] {
			fmt.Fprintf(w, "  %4d × %s\n", failures[k], k)
		}
	}
}

// handoffLine says who ran the prefill legs of the PD requests: Tandem (the epp hand-off, a
// handoff_epp step in the request's trace) or the decode pod's sidecar (no such step).
func handoffLine(results []Result, podRole map[string]string) string {
	byEPP, bySidecar := 0, 0
	for _, r := range results {
		if k := r.Kind(podRole[r.Pod]); r.Err != "" || (k != KindPD && k != KindRecomputed) {
			continue
		}
		epp := false
		for _, s := range r.Steps {
			if strings.HasPrefix(s, "handoff_epp") {
				epp = true
			}
		}
		if epp {
			byEPP++
		} else {
			bySidecar++
		}
	}
	switch {
	case byEPP+bySidecar == 0:
		return "hand-off: no PD request, so no prefill leg ran"
	case byEPP == 0:
		return fmt.Sprintf("hand-off: sidecar — each decode pod's routing sidecar ran the prefill leg of all %d PD requests (--handoff epp makes Tandem run it)", bySidecar)
	case bySidecar == 0:
		return fmt.Sprintf("hand-off: epp — Tandem ran the prefill leg of all %d PD requests itself", byEPP)
	}
	return fmt.Sprintf("hand-off: Tandem (epp) ran %d prefill legs, the decode pods' sidecars %d", byEPP, bySidecar)
}

// received counts the HTTP inference requests a pod got (the recorder's sequence number).
func received(p *Pod) int {
	reqs := p.Server.Requests()
	if len(reqs) == 0 {
		return 0
	}
	return int(reqs[len(reqs)-1].Seq)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// CurlHint tells the user how to reach the stack by hand: a long prompt that goes to a
// prefill/decode pair, and a short one that goes to the standard pod.
func CurlHint(w io.Writer, gatewayURL string) {
	fmt.Fprintf(w, `
Try it by hand (gateway → Tandem → pods). A prompt of %d+ tokens goes to a prefill/decode pair:
  curl -sN %s/v1/completions -H 'content-type: application/json' -D - \
    -d '{"model":"%s","max_tokens":8,"stream":true,"prompt":"'"$(printf 'Tandem sends long prompts to a prefill and decode pair. %%.0s' $(seq 150))"'"}'
  (headers: X-Sim-Pod names a decode pod, x-tandem-trace shows the PD steps; a short prompt such as
  "Hello, Tandem" goes to the standard pod, whose bucket holds prompts under %d tokens)
`, BucketTokens, gatewayURL, Model, BucketTokens)
}
