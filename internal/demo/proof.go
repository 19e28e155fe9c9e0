package demo

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tandem-epp/tandem/internal/proof"
	"github.com/tandem-epp/tandem/internal/sim"
)

// The broken pair: the demo breaks one decode pod's KV connector partway through the replay
// (the simulator's recompute_kv fault: the pod computes every prompt itself and still answers
// 200), and the report shows Tandem's transfer proof catching it (tandem_pd_transfer_total,
// the pd_transfer_held trace step) beside the pods' own account (X-Sim headers).

// transferMetric is the proof's counter on Tandem's /metrics.
const transferMetric = "tandem_pd_transfer_total{"

// stepPair is the decision trace step of a scored prefill/decode pair (pd.StepPair; the demo
// reads Tandem's traces without linking its picker).
const stepPair = "pair"

// Transfer is one series of Tandem's tandem_pd_transfer_total: the PD requests of one pod
// pair (pod names, without the namespace) with one verdict.
type Transfer struct {
	Prefill, Decode, Result string
	Count                   float64
}

// Break is what the demo did to its broken decode pod.
type Break struct {
	Pod   string    // the decode pod whose KV connector broke; "" when every pod stayed healthy
	Start time.Time // when the replay started
	At    time.Time // when the connector broke; zero if the replay ended first
}

// breakPod breaks the named decode pod's KV connector (the recompute_kv fault).
func breakPod(st *Stack, name string) error {
	p, err := findDecode(st, name)
	if err != nil {
		return err
	}
	return p.Server.SetFaults(sim.Faults{RecomputeKV: true})
}

// findDecode returns the stack's decode pod of that name.
func findDecode(st *Stack, name string) (*Pod, error) {
	var names []string
	for _, p := range st.Pods {
		if p.Role == sim.RoleDecode {
			if p.Name == name {
				return p, nil
			}
			names = append(names, p.Name)
		}
	}
	return nil, fmt.Errorf("--broken-decode %q: the demo has no decode pod of that name (it has %s)", name, strings.Join(names, ", "))
}

// markRecomputed marks the requests the broken pod answered by computing the prompt itself
// after the break, on a PD pick (their decision trace pairs them with a prefill pod): those are
// the PD requests its broken connector recomputed, not a whole request it was sent after a
// failed prefill leg.
func markRecomputed(results []Result, brk Break) {
	if brk.Pod == "" {
		return
	}
	for i := range results {
		r := &results[i]
		r.Recomputed = r.Err == "" && r.Pod == brk.Pod && !r.PD && r.LocalPrefill && !r.Done.Before(brk.At) &&
			slices.Contains(r.Steps, stepPair)
	}
}

// ScrapeTransfers reads Tandem's tandem_pd_transfer_total from its metrics endpoint.
func ScrapeTransfers(url string) ([]Transfer, error) { return scrape(url, parseTransfers) }

func parseTransfers(r io.Reader) ([]Transfer, error) {
	var out []Transfer
	podName := func(key string) string { // "namespace/name"
		_, name, _ := strings.Cut(key, "/")
		return name
	}
	err := parseSeries(r, []string{transferMetric}, func(labels map[string]string, v float64) {
		out = append(out, Transfer{Prefill: podName(labels["prefill_pod"]), Decode: podName(labels["decode_pod"]), Result: labels["result"], Count: v})
	})
	return out, err
}

// scrapeTransfersSettled scrapes the proof's counter until it has judged want PD requests
// (a verdict is counted as the decode answer ends, a moment after the client read it), or
// for at most 3 s.
func scrapeTransfersSettled(url string, want int) ([]Transfer, error) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		ts, err := ScrapeTransfers(url)
		var n float64
		for _, t := range ts {
			n += t.Count
		}
		if err != nil || n >= float64(want) || time.Now().After(deadline) {
			return ts, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pdRequests counts the requests a decode pod served as PD (with or without its KV).
func pdRequests(results []Result, podRole map[string]string) int {
	n := 0
	for i := range results {
		if k := results[i].Kind(podRole[results[i].Pod]); results[i].Err == "" && (k == KindPD || k == KindRecomputed) {
			n++
		}
	}
	return n
}

func ordinal(n int) string {
	switch n {
	case 1:
		return "1st"
	case 2:
		return "2nd"
	case 3:
		return "3rd"
	}
	return fmt.Sprintf("%dth", n)
}

// ReportProof prints the proof of disaggregation: Tandem's verdict counts per pod pair beside
// the decode pods' own account and, when the demo broke a decode pod, when Tandem caught it and
// how the PD work moved off it.
func ReportProof(w io.Writer, st *Stack, results []Result, brk Break, transfers []Transfer, err error) {
	podRole := map[string]string{}
	for _, p := range st.Pods {
		podRole[p.Name] = p.Role
	}
	fmt.Fprintln(w, "\nProof of disaggregation (Tandem's tandem_pd_transfer_total: each PD request judged from its decode answer):")
	type pair struct{ prefill, decode string }
	byPair := map[pair]map[string]float64{}
	recomputedOn := map[string]float64{} // decode pod -> recomputed verdicts
	for _, t := range transfers {
		k := pair{t.Prefill, t.Decode}
		if byPair[k] == nil {
			byPair[k] = map[string]float64{}
		}
		byPair[k][t.Result] += t.Count
		if t.Result == "recomputed" {
			recomputedOn[t.Decode] += t.Count
		}
	}
	pairs := make([]pair, 0, len(byPair))
	for k := range byPair {
		pairs = append(pairs, k)
	}
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].decode != pairs[j].decode {
			return pairs[i].decode < pairs[j].decode
		}
		return pairs[i].prefill < pairs[j].prefill
	})
	switch {
	case err != nil:
		fmt.Fprintf(w, "  metrics not readable (%v)\n", err)
	case len(pairs) == 0:
		fmt.Fprintln(w, "  no tandem_pd_transfer_total series on Tandem's /metrics (no PD request was judged)")
	}
	for _, k := range pairs {
		m := byPair[k]
		fmt.Fprintf(w, "  %-22s verified %4.0f   recomputed %4.0f   unknown %4.0f\n", k.prefill+" → "+k.decode, m["verified"], m["recomputed"], m["unknown"])
	}
	var account []string
	for _, p := range st.Pods {
		if p.Role != sim.RoleDecode {
			continue
		}
		used, recomputed := 0, 0
		for i := range results {
			r := &results[i]
			if r.Err != "" || r.Pod != p.Name {
				continue
			}
			switch r.Kind(p.Role) {
			case KindPD:
				used++
			case KindRecomputed:
				recomputed++
			}
		}
		account = append(account, fmt.Sprintf("%s used the transferred KV %d×, recomputed the prompt %d×", p.Name, used, recomputed))
	}
	fmt.Fprintf(w, "  The decode pods' own account (X-Sim headers):\n    %s.\n", strings.Join(account, ";\n    "))
	podRecomputed := 0
	for i := range results {
		if results[i].Recomputed {
			podRecomputed++
		}
	}
	var tandemRecomputed float64
	for _, n := range recomputedOn {
		tandemRecomputed += n
	}
	if tandemRecomputed < float64(podRecomputed) {
		fmt.Fprintln(w, "  (A recomputing pod whose own prefix cache held most of a prompt reports those hits as cached tokens, so\n"+
			"  Tandem may judge that request unknown or verified: see docs/proof.md, Limits.)")
	}

	if brk.Pod == "" {
		fmt.Fprintln(w, "  Every pod stayed healthy (--broken-decode none): a healthy pool counts 0 recomputed.")
		return
	}
	if brk.At.IsZero() {
		fmt.Fprintf(w, "  %s was to break its KV connector, but the replay ended first.\n", brk.Pod)
		return
	}
	at := func(t time.Time) string { return fmt.Sprintf("%.1fs", t.Sub(brk.Start).Seconds()) }
	fromStart := !brk.At.After(brk.Start)
	when := "broke at " + at(brk.At) + " into the replay"
	if fromStart {
		when = "was broken from the start"
	}
	fmt.Fprintf(w, "Broken pair: %s's KV connector %s (the simulator's recompute_kv fault: it computes\n"+
		"  every prompt itself and still answers 200).\n", brk.Pod, when)

	// Caught: the first request whose decision trace shows the pod held out.
	heldStep := "pd_transfer_held:default/" + brk.Pod + ":"
	var heldAt time.Time
	heldTraces, readmitted := 0, 0
	for i := range results {
		r := &results[i]
		for _, s := range r.Steps {
			if strings.HasPrefix(s, heldStep) {
				heldTraces++
				if heldAt.IsZero() || r.Sent.Before(heldAt) {
					heldAt = r.Sent
				}
			}
			if s == "pd_transfer_readmitted" && r.Pod == brk.Pod {
				readmitted++
			}
		}
	}
	// Caught: Tandem's lenient policy holds a decode pod once HoldAfter of its last Window
	// judged transfers recomputed, so the evidence sufficed when the HoldAfter-th recomputed
	// answer ended (the pod's own account; unknown verdicts aside).
	var ends []time.Time // of the recomputed answers
	var last time.Time   // the broken pod's last request
	for i := range results {
		r := &results[i]
		if r.Err == "" && r.Pod == brk.Pod && r.Sent.After(last) {
			last = r.Sent
		}
		if r.Recomputed {
			ends = append(ends, r.Done)
		}
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	var caughtAt time.Time
	if len(ends) >= proof.DefaultHoldAfter {
		caughtAt = ends[proof.DefaultHoldAfter-1]
	}
	reached := 0 // PD requests sent to it broken before it was held
	for i := range results {
		if r := &results[i]; r.Recomputed && (heldAt.IsZero() || r.Sent.Before(heldAt)) {
			reached++
		}
	}
	switch {
	case heldAt.IsZero() && !caughtAt.IsZero() && !last.After(caughtAt):
		fmt.Fprintf(w, "  Its %s recomputed answer came at %s, %s after the break (Tandem holds a decode pod once %d of its last %d\n"+
			"  transfers recomputed), but no request came after it to show the hold. Tandem counted %.0f recomputed on it.\n",
			ordinal(proof.DefaultHoldAfter), at(caughtAt), ms(caughtAt.Sub(brk.At)), proof.DefaultHoldAfter, proof.DefaultWindow, recomputedOn[brk.Pod])
	case heldAt.IsZero():
		fmt.Fprintf(w, "  Not caught before the replay ended: %d PD requests reached it broken, Tandem counted %.0f recomputed.\n",
			reached, recomputedOn[brk.Pod])
	case caughtAt.IsZero():
		fmt.Fprintf(w, "  Held out of PD work from %s (pd_transfer_held in the decision trace of %d requests), after %d PD requests\n"+
			"  reached it broken (Tandem counted %.0f recomputed on it).\n", at(heldAt), heldTraces, reached, recomputedOn[brk.Pod])
	default:
		fmt.Fprintf(w, "  Caught: held out of PD work from %s (the first request whose decision trace shows pd_transfer_held), %s after\n"+
			"  the break; its %s recomputed answer (Tandem holds a decode pod once %d of its last %d transfers recomputed) had\n"+
			"  ended at %s; %d PD requests had reached it broken. pd_transfer_held is in the decision trace of %d requests.\n"+
			"  Tandem counted %.0f recomputed on it in all.\n",
			at(heldAt), ms(heldAt.Sub(brk.At)), ordinal(proof.DefaultHoldAfter), proof.DefaultHoldAfter, proof.DefaultWindow,
			at(caughtAt), reached, heldTraces, recomputedOn[brk.Pod])
	}
	if !heldAt.IsZero() {
		caughtAt = heldAt // from here on, "caught" is Tandem's own evidence
	}

	// Its share of the decode work (requests a decode pod served) before the break and once held.
	share := func(from, to time.Time) string {
		mine, all := 0, 0
		for i := range results {
			r := &results[i]
			if r.Err != "" || podRole[r.Pod] != sim.RoleDecode || r.Sent.Before(from) || (!to.IsZero() && !r.Sent.Before(to)) {
				continue
			}
			all++
			if r.Pod == brk.Pod {
				mine++
			}
		}
		if all == 0 {
			return "no decode requests"
		}
		return fmt.Sprintf("%.0f%% (%d of %d)", 100*float64(mine)/float64(all), mine, all)
	}
	var parts []string
	if !fromStart {
		parts = append(parts, share(brk.Start, brk.At)+" before the break")
	}
	if !heldAt.IsZero() {
		parts = append(parts, share(heldAt, time.Time{})+" once held")
	}
	line := fmt.Sprintf("  %s's share of the decode pods' requests: %s", brk.Pod, strings.Join(parts, ", "))
	if len(parts) == 0 {
		line = fmt.Sprintf("  %s never held: its share of the decode pods' requests after the break, %s", brk.Pod, share(brk.At, time.Time{}))
	}
	switch {
	case caughtAt.IsZero() || last.IsZero():
	case last.After(caughtAt):
		line += fmt.Sprintf(";\n  its last request was sent at %s, %s after it was caught", at(last), ms(last.Sub(caughtAt)))
	default:
		line += fmt.Sprintf(";\n  its last request was sent at %s, before it was caught", at(last))
	}
	fmt.Fprintln(w, line+".")
	if readmitted > 0 {
		fmt.Fprintf(w, "  %d requests readmitted it because no other pair could serve them (pd_transfer_readmitted).\n", readmitted)
	}
}
