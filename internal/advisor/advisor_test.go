package advisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

const model = "m"

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// poolOf is a snapshot of one model's pods: p prefill, d decode (one roleset), s standard.
func poolOf(p, d, s int) *pool.Snapshot {
	var eps []*pool.Endpoint
	add := func(name string, labels map[string]string) {
		labels[pool.LabelModelName] = model
		eps = append(eps, pool.NewEndpoint("ns", name, fmt.Sprintf("10.0.0.%d", len(eps)+1), 8000, 0, labels, nil))
	}
	for i := range p {
		add(fmt.Sprintf("prefill-%d", i), map[string]string{pool.LabelRoleName: "prefill", pool.LabelRolesetName: "rs"})
	}
	for i := range d {
		add(fmt.Sprintf("decode-%d", i), map[string]string{pool.LabelRoleName: "decode", pool.LabelRolesetName: "rs"})
	}
	for i := range s {
		add(fmt.Sprintf("standard-%d", i), map[string]string{})
	}
	return pool.NewStore().Publish(pool.Info{}, eps, true)
}

func keyOf(snap *pool.Snapshot, name string) string {
	for _, e := range snap.Endpoints {
		if e.Name == name {
			return e.Key()
		}
	}
	panic("no endpoint " + name)
}

// end is a completed request's last event.
func end(kind outcome.Kind, prefill, dest string, prompt, output int, picked, prefilled, ended time.Time) *outcome.Event {
	return &outcome.Event{Phase: outcome.PhaseEnd, Route: outcome.Route{Kind: kind, Prefill: prefill, Destination: dest,
		PromptTokens: prompt, Chunks: output, Picked: picked, PrefillEnd: prefilled, End: ended}}
}

// newAdvisor prices with the latency models' defaults, taken as learned (these tests feed
// the advisor alone, not the models).
func newAdvisor(clock *load.ManualClock) *Advisor {
	a := New(Options{Clock: clock, Models: latency.New(latency.Options{Clock: clock})})
	a.learned = 0
	return a
}

func TestObserveKeepsTheWindowOfCompletions(t *testing.T) {
	clock := load.NewManualClock(t0)
	a := New(Options{Clock: clock, Window: 10 * time.Second})
	snap := poolOf(1, 1, 0)
	dec := keyOf(snap, "decode-0")
	// Ignored: not an end, an error, and (later) older than the window.
	a.Observe(&outcome.Event{Phase: outcome.PhaseFirstByte, Route: outcome.Route{Kind: outcome.KindWhole, Destination: dec, End: t0}})
	failed := end(outcome.KindWhole, "", dec, 100, 5, t0, time.Time{}, t0)
	failed.Route.Err = errors.New("reset")
	a.Observe(failed)
	for i := range 20 {
		at := t0.Add(time.Duration(i) * time.Second)
		a.Observe(end(outcome.KindWhole, "", dec, 100, 5, at, time.Time{}, at))
	}
	clock.Set(t0.Add(19 * time.Second))
	a.mu.Lock()
	got, span := a.recentLocked(clock.Now())
	a.mu.Unlock()
	if len(got) != 11 || span != 10 {
		t.Fatalf("window at 19 s: %d completions over %v s, want the 11 of the last 10 s (9..19)", len(got), span)
	}
	if got[0].at != t0.Add(9*time.Second) || got[0].prompt != 100 || got[0].output != 5 {
		t.Errorf("oldest kept: %+v", got[0])
	}
	// Before the window has filled, the rate is over the time since the first completion.
	b := New(Options{Clock: clock, Window: time.Minute})
	for i := range 5 {
		b.Observe(end(outcome.KindWhole, "", dec, 100, 5, t0, time.Time{}, t0.Add(time.Duration(i)*time.Second)))
	}
	clock.Set(t0.Add(10 * time.Second))
	if ad := b.Advise(snap).Models[0]; ad.Requests != 5 || ad.WindowSeconds != 10 || ad.Rate != 0.5 {
		t.Errorf("5 completions 10 s after the first: %d over %v s at %v/s, want 5 over 10 s at 0.5/s", ad.Requests, ad.WindowSeconds, ad.Rate)
	}
}

func TestRingKeepsTheNewest(t *testing.T) {
	clock := load.NewManualClock(t0)
	a := New(Options{Clock: clock, Window: time.Hour})
	snap := poolOf(1, 1, 0)
	dec := keyOf(snap, "decode-0")
	for i := range maxSamples + 10 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		a.Observe(end(outcome.KindWhole, "", dec, i, 1, at, time.Time{}, at))
	}
	clock.Set(t0.Add(time.Duration(maxSamples+9) * time.Millisecond))
	a.mu.Lock()
	got, span := a.recentLocked(clock.Now())
	a.mu.Unlock()
	if len(got) != maxSamples || got[0].prompt != 10 || got[len(got)-1].prompt != maxSamples+9 {
		t.Fatalf("kept %d, oldest %d, newest %d; want the newest %d", len(got), got[0].prompt, got[len(got)-1].prompt, maxSamples)
	}
	if want := float64(maxSamples-1) / 1000; math.Abs(span-want) > 1e-9 {
		t.Errorf("span %v, want the %v s the kept ones cover", span, want)
	}
}

func TestUnionOfPrefillLegs(t *testing.T) {
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, c := range []struct {
		legs [][2]float64
		want float64
	}{
		{nil, 0},
		{[][2]float64{{0, 1}, {2, 3}}, 2},
		{[][2]float64{{0, 2}, {1, 3}}, 3},         // overlapping
		{[][2]float64{{1, 3}, {0, 5}, {4, 6}}, 6}, // nested, out of order
	} {
		var ls [][2]time.Time
		for _, l := range c.legs {
			ls = append(ls, [2]time.Time{at(l[0]), at(l[1])})
		}
		if got := union(ls); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("union(%v) = %v, want %v", c.legs, got, c.want)
		}
	}
}

func TestSplitsAndMoves(t *testing.T) {
	ss := Splits(10)
	if len(ss) != 45 || ss[0] != (Split{1, 1, 8}) || ss[len(ss)-1] != (Split{9, 1, 0}) {
		t.Fatalf("Splits(10): %d, first %v, last %v; want 45 from 1p1d8s to 9p1d0s", len(ss), ss[0], ss[len(ss)-1])
	}
	if m := (Split{4, 4, 2}).Moves(Split{5, 4, 1}); m != 1 {
		t.Errorf("4p4d2s → 5p4d1s: %d moves, want 1", m)
	}
	if m := (Split{4, 4, 2}).Moves(Split{9, 1, 0}); m != 5 {
		t.Errorf("4p4d2s → 9p1d0s: %d moves, want 5", m)
	}
	if len(Splits(1)) != 0 {
		t.Error("one pod cannot keep a pair")
	}
}

func TestPickBreaksTies(t *testing.T) {
	splits := []Split{{1, 1, 3}, {2, 2, 1}, {2, 1, 2}, {3, 1, 1}}
	anchor := Split{2, 1, 2}
	// Within the margin: the fewest moves from the anchor wins even if predicted lower.
	if got := splits[pick(splits, []float64{10, 9.9, 9.6, 1}, 10, anchor)]; got != anchor {
		t.Errorf("fewest moves: %v, want the anchor %v", got, anchor)
	}
	// Outside the margin nothing counts, however close.
	if got := splits[pick(splits, []float64{10, 9.9, 9, 1}, 10, anchor)]; got != (Split{1, 1, 3}) {
		t.Errorf("anchor below the margin: %v, want 1p1d3s (1 move, the higher of the two at 1)", got)
	}
	// Equal moves: the higher prediction; then the more decode pods.
	anchor = Split{2, 2, 1}
	if got := pick([]Split{{2, 1, 2}, {3, 1, 1}}, []float64{9.8, 10}, 10, anchor); got != 1 {
		t.Errorf("higher prediction: %v, want 3p1d1s", got)
	}
	if got := pick([]Split{{3, 1, 1}, {2, 3, 0}}, []float64{10, 10}, 10, Split{2, 2, 1}); got != 1 {
		t.Errorf("more decode pods: %v, want 2p3d0s", got)
	}
}

// A mix of identical requests on an engine with round coefficients has capacities that can be
// worked out by hand.
func TestPodCapacitiesByHand(t *testing.T) {
	ob := objectives{ttft: 1, ttftPrefill: 3, tpot: 0.05, goodput: 0.9}
	reqs := func(n int, prompt, output float64) []request {
		out := make([]request, n)
		for i := range out {
			out[i] = request{prompt: prompt, output: output}
		}
		return out
	}
	// Prefill 0.1 s whatever the prompt, no hand-over, a 1 ms step: a prompt waits while its
	// 0.1 s ÷ (1 − load) fits in 1 s − 1 ms, so up to load 1 − 0.1/0.999 and 10 × that per s.
	e := &engine{prefill: [3]float64{0.1, 0, 0}, step: [3]float64{0.001, 0, 0}, prefillScale: 1}
	m := e.mix(reqs(100, 1000, 1), ob)
	if want := (1 - 0.1/0.999) / 0.1; math.Abs(m.prefillRate-want) > 1e-9 {
		t.Errorf("prefill pod: %v req/s, want %v", m.prefillRate, want)
	}
	// A longer prompt has 3 × its prefill: prefill 0.5 s, objective 1.5 s.
	e.prefill[0] = 0.5
	m = e.mix(reqs(100, 1000, 1), ob)
	if want := (1 - 0.5/1.499) / 0.5; math.Abs(m.prefillRate-want) > 1e-9 {
		t.Errorf("prefill pod, long prompts: %v req/s, want %v", m.prefillRate, want)
	}

	// Decoding: a 10 ms step growing 1 ms per resident request, 100 output tokens each:
	// τ = 0.01 / (1 − 0.001·100·r) ≤ 0.05 up to r = 8.
	e = &engine{prefill: [3]float64{0.01, 0, 0}, step: [3]float64{0.01, 0.001, 0}, prefillScale: 1}
	m = e.mix(reqs(100, 1000, 100), ob)
	if got := highest(math.Inf(1), func(r float64) bool { return decoding{pd: m, rPD: r}.ok() }); math.Abs(got-8) > 1e-6 {
		t.Errorf("decode pod, TPOT-bound: %v req/s, want 8", got)
	}
	// KV-bound: a flat 10 ms step, 105,000 KV tokens: r · 100 · 1050 · 0.01 ≤ 0.9 · 105,000.
	e = &engine{prefill: [3]float64{0.01, 0, 0}, step: [3]float64{0.01, 0, 0}, kvCap: 105000, prefillScale: 1}
	m = e.mix(reqs(100, 1000, 100), ob)
	if got := highest(math.Inf(1), func(r float64) bool { return decoding{pd: m, rPD: r}.ok() }); math.Abs(got-90) > 1e-6 {
		t.Errorf("decode pod, KV-bound: %v req/s, want 90", got)
	}
	// Run whole, the prefills take their share first: τ = 0.01 / (1 − 0.01·r − 0.1·r) ≤ 0.05
	// up to r = 0.8 / 0.11.
	e = &engine{prefill: [3]float64{0.01, 0, 0}, step: [3]float64{0.01, 0.001, 0}, prefillScale: 1}
	m = e.mix(reqs(100, 1000, 100), ob)
	if got := highest(m.localRate, func(r float64) bool { return decoding{whole: m, rW: r}.ok() }); math.Abs(got-0.8/0.11) > 1e-6 {
		t.Errorf("standard pod: %v req/s, want %v", got, 0.8/0.11)
	}
}

// feed feeds completions for secs seconds: pdPerSec PD requests of pdPrompt tokens, each
// prefill leg busy for legSecs on its prefill pod, and wholePerSec whole requests of
// wholePrompt tokens on the standard pods, all of output tokens; the clock ends after the last.
func feed(a *Advisor, clock *load.ManualClock, snap *pool.Snapshot, secs, pdPerSec, wholePerSec, pdPrompt, wholePrompt, output int, legSecs float64) {
	var prefills, decodes, standards []string
	for _, e := range snap.Endpoints {
		switch e.Role {
		case pool.RolePrefill:
			prefills = append(prefills, e.Key())
		case pool.RoleDecode:
			decodes = append(decodes, e.Key())
		default:
			standards = append(standards, e.Key())
		}
	}
	start := clock.Now()
	i := 0
	for s := range secs {
		for k := range pdPerSec {
			at := start.Add(time.Duration(s)*time.Second + time.Duration(k)*time.Second/time.Duration(pdPerSec))
			leg := at.Add(time.Duration(legSecs * float64(time.Second)))
			a.Observe(end(outcome.KindPD, prefills[i%len(prefills)], decodes[i%len(decodes)], pdPrompt, output, at, leg, leg.Add(time.Second)))
			i++
		}
		for k := range wholePerSec {
			if len(standards) == 0 {
				break
			}
			at := start.Add(time.Duration(s)*time.Second + time.Duration(k)*time.Second/time.Duration(wholePerSec))
			a.Observe(end(outcome.KindWhole, "", standards[i%len(standards)], wholePrompt, output, at, time.Time{}, at.Add(time.Second)))
			i++
		}
	}
	clock.Set(start.Add(time.Duration(secs)*time.Second + time.Second))
}

func TestAdviceWithoutTrafficStandsOnTheCurrentSplit(t *testing.T) {
	clock := load.NewManualClock(t0)
	a := newAdvisor(clock)
	ad := a.Advise(poolOf(2, 2, 1)).Models[0]
	if ad.Recommended != ad.Current || ad.Confidence != 0 || ad.Binding != "" || ad.Requests != 0 {
		t.Errorf("no traffic: %+v", ad)
	}
	// A little traffic: confidence too low to move.
	snap := poolOf(2, 2, 1)
	feed(a, clock, snap, 2, 5, 0, 20000, 0, 1, 0.5)
	ad = a.Advise(snap).Models[0]
	if ad.Confidence >= minConfidence || ad.Recommended != ad.Current {
		t.Errorf("10 requests: confidence %v, recommended %+v; want below %v and the current split", ad.Confidence, ad.Recommended, minConfidence)
	}
	if len(a.Advise(nil).Models) != 0 {
		t.Error("no pool: no advice")
	}
}

func TestAdviceFollowsTheBindingStage(t *testing.T) {
	// Long prompts on the pairs (the short ones, run whole, show the router runs no long one
	// whole), one output token: the prefill pods bind; the advice adds prefill pods.
	clock := load.NewManualClock(t0)
	a := newAdvisor(clock)
	snap := poolOf(2, 2, 2)
	feed(a, clock, snap, 60, 10, 2, 8000, 200, 1, 0.09)
	ad := a.Advise(snap).Models[0]
	t.Logf("prefill-heavy: %+v", ad)
	if ad.Binding != StagePrefill || ad.Saturation.Prefill <= ad.Saturation.Decode {
		t.Errorf("prefill-heavy traffic binds %q (saturation %+v), want prefill", ad.Binding, ad.Saturation)
	}
	if ad.Recommended.Prefill <= 2 || ad.RecommendedCapacity <= ad.CurrentCapacity {
		t.Errorf("prefill-heavy traffic: recommended %+v (%v req/s against %v now), want more prefill pods and more capacity",
			ad.Recommended, ad.RecommendedCapacity, ad.CurrentCapacity)
	}
	// The same traffic twice as fast: every stage twice as saturated.
	b := newAdvisor(load.NewManualClock(t0))
	bc := b.o.Clock.(*load.ManualClock)
	feed(b, bc, snap, 60, 20, 4, 8000, 200, 1, 0.09)
	bd := b.Advise(snap).Models[0]
	if r := bd.Saturation.Prefill / ad.Saturation.Prefill; math.Abs(r-2) > 0.1 {
		t.Errorf("twice the traffic: prefill saturation ×%v, want ×2", r)
	}

	// Short prompts, long outputs, on a prefill-heavy split: the decode pods bind; the advice
	// adds decode pods.
	clock = load.NewManualClock(t0)
	a = newAdvisor(clock)
	snap = poolOf(4, 1, 1)
	feed(a, clock, snap, 60, 30, 2, 200, 200, 400, 0.02)
	ad = a.Advise(snap).Models[0]
	t.Logf("decode-heavy: %+v", ad)
	if ad.Binding != StageDecode {
		t.Errorf("decode-heavy traffic binds %q (saturation %+v), want decode", ad.Binding, ad.Saturation)
	}
	if ad.Recommended.Decode <= 1 || ad.Recommended.Prefill >= 4 {
		t.Errorf("decode-heavy traffic: recommended %+v, want decode pods from prefill pods", ad.Recommended)
	}
}

func TestPublishedGaugesAndStatus(t *testing.T) {
	clock := load.NewManualClock(t0)
	a := newAdvisor(clock)
	snap := poolOf(2, 2, 1)
	feed(a, clock, snap, 30, 20, 2, 2000, 500, 50, 0.05)
	p := a.Publish(func() *pool.Snapshot { return snap })
	reg := prometheus.NewRegistry()
	reg.MustRegister(p)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	rep := p.Report()
	ad := rep.Models[0]
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			k := f.GetName()
			for _, l := range m.GetLabel() {
				k += "," + l.GetName() + "=" + l.GetValue()
			}
			got[k] = m.GetGauge().GetValue()
		}
	}
	for k, want := range map[string]float64{
		"tandem_recommended_pods,model=m,role=prefill":                     float64(ad.Recommended.Prefill),
		"tandem_recommended_pods,model=m,role=decode":                      float64(ad.Recommended.Decode),
		"tandem_recommended_pods,model=m,role=standard":                    float64(ad.Recommended.Standard),
		"tandem_stage_saturation,model=m,stage=prefill":                    ad.Saturation.Prefill,
		"tandem_stage_binding,model=m,stage=" + ad.Binding:                 1,
		"tandem_advice_confidence,model=m":                                 ad.Confidence,
		"tandem_advice_window_requests,model=m":                            float64(ad.Requests),
		"tandem_advice_capacity_requests_per_second,model=m,split=current": ad.CurrentCapacity,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
	// The report is reused within Refresh and recomputed after it.
	clock.Set(rep.At.Add(Refresh - time.Millisecond))
	if p.Report().At != rep.At {
		t.Error("the report was recomputed within Refresh")
	}
	clock.Set(rep.At.Add(Refresh))
	if p.Report().At == rep.At {
		t.Error("the report was not recomputed after Refresh")
	}

	srv := httptest.NewServer(p)
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.NewDecoder(resp.Body).Decode(&back); err != nil || len(back.Models) != 1 || back.Objectives.TPOTSeconds != 0.05 {
		t.Errorf("GET: %v, %+v", err, back)
	}
	resp.Body.Close()
	resp, err = http.Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %s, want 405", resp.Status)
	}
}

// TestMetricsDocListsTheGauges checks docs/metrics.md's advisor table against the gauges the
// advisor exports, both ways, with their labels.
func TestMetricsDocListsTheGauges(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, "<!-- advisor:start -->"), strings.Index(doc, "<!-- advisor:end -->")
	if i < 0 || j < i {
		t.Fatal("docs/metrics.md lacks the <!-- advisor:start --> … <!-- advisor:end --> markers")
	}
	row := regexp.MustCompile("^\\| `([a-z_]+)` \\| gauge \\| ([^|]*) \\|")
	documented := map[string]string{}
	for _, line := range strings.Split(doc[i:j], "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			documented[m[1]] = strings.ReplaceAll(strings.TrimSpace(m[2]), "`", "")
		}
	}
	ch := make(chan *prometheus.Desc, 16)
	(&Published{}).Describe(ch)
	close(ch)
	exported := map[string]bool{}
	for d := range ch {
		// Desc has no accessors: its String() names fqName and variableLabels.
		s := d.String()
		name := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(s)[1]
		labels := regexp.MustCompile(`variableLabels: \{([^}]*)\}`).FindStringSubmatch(s)[1]
		exported[name] = true
		if got, ok := documented[name]; !ok {
			t.Errorf("%s is exported but not in docs/metrics.md's advisor table", name)
		} else if want := strings.Join(strings.Split(labels, ","), ", "); got != want {
			t.Errorf("%s: documented labels %q, exported %q", name, got, want)
		}
	}
	for name := range documented {
		if !exported[name] {
			t.Errorf("docs/metrics.md documents %s, which the advisor does not export", name)
		}
	}
}

// An objective no load can meet (a TPOT below one request's decode step) saturates the stage
// at MaxSaturation, a number JSON and Prometheus both carry.
func TestUnmeetableObjectiveStaysFinite(t *testing.T) {
	clock := load.NewManualClock(t0)
	a := New(Options{Clock: clock, Models: latency.New(latency.Options{Clock: clock}), TPOT: 2 * time.Millisecond})
	a.learned = 0
	snap := poolOf(2, 2, 1)
	feed(a, clock, snap, 30, 10, 5, 2000, 500, 50, 0.05)
	ad := a.Advise(snap).Models[0]
	if ad.Saturation.Decode != MaxSaturation || ad.Saturation.Standard != MaxSaturation {
		t.Errorf("saturation %+v, want decode and standard at %v", ad.Saturation, float64(MaxSaturation))
	}
	rec := httptest.NewRecorder()
	a.Publish(func() *pool.Snapshot { return snap }).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/advice", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"decode": 1000`) {
		t.Errorf("GET /advice: %d %s", rec.Code, rec.Body.String())
	}
}

// A PD route whose prefill leg never ran (a gateway that forwards requests whole, a fallback
// to a standard pod) counts as run whole where it was served, and books no prefill time.
func TestPrefillNotRunCountsAsWhole(t *testing.T) {
	clock := load.NewManualClock(t0)
	a := newAdvisor(clock)
	snap := poolOf(1, 1, 0)
	pre, dec := keyOf(snap, "prefill-0"), keyOf(snap, "decode-0")
	for i := range 100 {
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		e := end(outcome.KindPD, pre, dec, 1000, 10, at, at, at.Add(time.Second))
		e.Route.PrefillErr = errors.New("prefill not run: the gateway forwards the request whole")
		a.Observe(e)
	}
	clock.Set(t0.Add(12 * time.Second))
	ad := a.Advise(snap).Models[0]
	if ad.Saturation.Prefill != 0 || ad.Saturation.Decode <= 0 || ad.Fits.PrefillScale != 1 {
		t.Errorf("routed whole: saturation %+v, prefill scale %v; want no prefill load, decode load, scale 1", ad.Saturation, ad.Fits.PrefillScale)
	}
}

// The prefill pods' measured time calibrates the fit the same whatever the decodes after
// the legs take: how long requests decode must not move the prefill scale.
func TestPrefillScaleIgnoresDecodeTime(t *testing.T) {
	scale := func(decode time.Duration) float64 {
		clock := load.NewManualClock(t0)
		a := newAdvisor(clock)
		snap := poolOf(2, 2, 0)
		pres, decs := []string{keyOf(snap, "prefill-0"), keyOf(snap, "prefill-1")}, []string{keyOf(snap, "decode-0"), keyOf(snap, "decode-1")}
		for i := range 1200 {
			at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
			leg := at.Add(90 * time.Millisecond)
			a.Observe(end(outcome.KindPD, pres[i%2], decs[i%2], 2000, 50, at, leg, leg.Add(decode)))
		}
		clock.Set(t0.Add(120*time.Second + decode))
		return a.Advise(snap).Models[0].Fits.PrefillScale
	}
	short, long := scale(time.Second), scale(50*time.Second)
	if short == 1 || math.Abs(long/short-1) > 0.01 {
		t.Errorf("prefill scale %v with 1 s decodes, %v with 50 s: want the same, measured (not 1)", short, long)
	}
}

// Two models in one pool are advised apart; a pod that left still counts for the window.
func TestModelsApartAndDepartedPods(t *testing.T) {
	clock := load.NewManualClock(t0)
	a := newAdvisor(clock)
	snap := poolOf(1, 1, 1)
	other := pool.NewEndpoint("ns", "other-0", "10.0.1.1", 8000, 0, map[string]string{pool.LabelModelName: "other"}, nil)
	both := pool.NewStore().Publish(pool.Info{}, append(slices.Clone(snap.Endpoints), other), true)
	a.Advise(both) // the advisor sees the pods
	std := keyOf(snap, "standard-0")
	for i := range 10 {
		at := t0.Add(time.Duration(i) * time.Second)
		a.Observe(end(outcome.KindWhole, "", std, 100, 5, at, time.Time{}, at))
		a.Observe(end(outcome.KindWhole, "", other.Key(), 100, 5, at, time.Time{}, at))
		a.Observe(end(outcome.KindWhole, "", other.Key(), 100, 5, at, time.Time{}, at))
	}
	clock.Set(t0.Add(10 * time.Second))
	rep := a.Advise(both)
	if len(rep.Models) != 2 || rep.Models[0].Model != model || rep.Models[0].Requests != 10 || rep.Models[1].Model != "other" || rep.Models[1].Requests != 20 {
		t.Fatalf("two models: %+v", rep.Models)
	}
	if rep.Models[1].Current != (Split{Standard: 1}) || rep.Models[1].Recommended != rep.Models[1].Current || rep.Models[1].CurrentCapacity != 0 {
		t.Errorf("a model without a pair: %+v, want its one standard pod and no split", rep.Models[1])
	}
	// standard-0 leaves: its completions still count until they leave the window.
	var left []*pool.Endpoint
	for _, e := range snap.Endpoints {
		if e.Key() != std {
			left = append(left, e)
		}
	}
	after := pool.NewStore().Publish(pool.Info{}, left, true)
	if ad := a.Advise(after).Models[0]; ad.Requests != 10 || ad.Current != (Split{1, 1, 0}) {
		t.Errorf("after standard-0 left: %d requests on %+v, want its 10 on 1p1d0s", ad.Requests, ad.Current)
	}
	clock.Set(t0.Add(2 * time.Minute))
	if ad := a.Advise(after).Models[0]; ad.Requests != 0 {
		t.Errorf("a window later: %d requests, want 0", ad.Requests)
	}
}

// The advice moves pods between the roles the pool has: it keeps one of each and adds none.
func TestAdviceKeepsThePoolsRoles(t *testing.T) {
	for _, c := range []struct {
		s, cur Split
		ok     bool
	}{
		{Split{3, 2, 0}, Split{2, 2, 1}, false}, // drops the standard pods
		{Split{2, 2, 1}, Split{3, 2, 0}, false}, // adds one
		{Split{4, 1, 0}, Split{3, 2, 0}, true},
		{Split{1, 3, 1}, Split{2, 2, 1}, true},
		{Split{0, 4, 1}, Split{2, 2, 1}, false},
	} {
		if got := allowed(c.s, c.cur); got != c.ok {
			t.Errorf("allowed(%v from %v) = %v, want %v", c.s, c.cur, got, c.ok)
		}
	}
	// Prefill-heavy traffic on a pool without standard pods: more prefill pods, still none.
	clock := load.NewManualClock(t0)
	a := newAdvisor(clock)
	snap := poolOf(2, 3, 0)
	feed(a, clock, snap, 60, 10, 0, 8000, 0, 1, 0.09)
	if ad := a.Advise(snap).Models[0]; ad.Recommended.Standard != 0 || ad.Recommended.Prefill <= 2 {
		t.Errorf("no standard pods, prefill-heavy: recommended %+v, want more prefill pods and no standard pod", ad.Recommended)
	}
}

// Above fullSearch pods, the splits priced are a grid and the neighbourhood of the current
// split and the anchor, not every split.
func TestLargePoolPricesABoundedSet(t *testing.T) {
	cur := Split{400, 400, 200}
	cs := candidates(cur, Split{500, 300, 200})
	if len(cs) > 2*gridSteps*gridSteps || len(cs) < gridSteps {
		t.Fatalf("1000 pods: %d candidates, want between %d and %d", len(cs), gridSteps, 2*gridSteps*gridSteps)
	}
	want := map[Split]bool{cur: false, {500, 300, 200}: false, {401, 399, 200}: false, {402, 400, 198}: false}
	for _, s := range cs {
		if !allowed(s, cur) || s.Pods() != 1000 {
			t.Fatalf("candidate %+v is not a split of 1000 pods keeping the roles", s)
		}
		if _, ok := want[s]; ok {
			want[s] = true
		}
	}
	for s, seen := range want {
		if !seen {
			t.Errorf("%+v (near the current split or the anchor) not priced", s)
		}
	}
	if n := len(candidates(Split{4, 4, 2}, Split{4, 4, 2})); n != 36 {
		t.Errorf("10 pods with standard pods: %d candidates, want the 36 keeping one of each role", n)
	}
}

// BenchmarkAdvise is one report on pools of 10, 64 and 1000 pods (the traffic of a minute).
func BenchmarkAdvise(b *testing.B) {
	for _, n := range []int{10, 64, 1000} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			clock := load.NewManualClock(t0)
			a := newAdvisor(clock)
			snap := poolOf(n*4/10, n*4/10, n-2*(n*4/10))
			feed(a, clock, snap, 60, 20, 10, 3000, 800, 100, 0.05)
			b.ResetTimer()
			for range b.N {
				a.Advise(snap)
			}
		})
	}
}
