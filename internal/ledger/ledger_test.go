package ledger_test

import (
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/telemetry"
)

var t0 = time.Unix(1_700_000_000, 0)

// The seed's numbers, worked by hand.
func TestHybridScore(t *testing.T) {
	cases := []struct {
		name                     string
		load, match, min, factor float64
		want                     float64
	}{
		{"full match halves the load", 1000, 100, 0, 0.5, 500},
		{"30% match discounts 4.5%: 1000·(1 − 0.09·0.5)", 1000, 30, 0, 0.5, 955},
		{"70% match discounts 24.5%: 1000·(1 − 0.49·0.5)", 1000, 70, 0, 0.5, 755},
		{"no match: the load", 1000, 0, 0, 0.5, 1000},
		{"idle pod: the bare discount, 1 − 0.25·0.5", 0, 50, 0, 0.5, 0.875},
		{"idle pod just under 1 is idle", 0.99, 100, 0, 0.5, 0.5},
		{"load exactly 1 is busy", 1, 100, 0, 0.5, 0.5},
		{"min match 40: a 30% match is no match", 1000, 30, 40, 0.5, 1000},
		{"min match 40: a 40% match counts, 1 − 0.16·0.5", 1000, 40, 40, 0.5, 920},
		{"factor 1: a full match scores 0", 1000, 100, 0, 1, 0},
		{"factor 0: no discount", 1000, 100, 0, 0, 1000},
	}
	for _, tc := range cases {
		if got := ledger.HybridScore(tc.load, tc.match, tc.min, tc.factor); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	// active 4000 + 0.3·kv 10000 = 7000
	if got := ledger.TokenLoad(4000, 10000, 0.3); got != 7000 {
		t.Errorf("TokenLoad = %v, want 7000", got)
	}
}

func TestNewTokens(t *testing.T) {
	cases := []struct {
		name      string
		prompt    int
		delta     int
		haveDelta bool
		prefix    bool
		match     float64
		want      float64
		rule      ledger.Rule
	}{
		{"session delta wins over the prefix match", 1000, 150, true, true, 90, 150, ledger.RuleSessionDelta},
		{"prefix match: 1000·(100 − 70)/100", 1000, 0, false, true, 70, 300, ledger.RulePrefixMatch},
		{"prefix lookup with no match: whole prompt, by rule 2", 1000, 0, false, true, 0, 1000, ledger.RulePrefixMatch},
		{"token_load: whole prompt", 1000, 0, false, false, 70, 1000, ledger.RuleWholePrompt},
	}
	for _, tc := range cases {
		got, rule := ledger.NewTokens(tc.prompt, tc.delta, tc.haveDelta, tc.prefix, tc.match)
		if got != tc.want || rule != tc.rule {
			t.Errorf("%s: %v by %s, want %v by %s", tc.name, got, rule, tc.want, tc.rule)
		}
	}
	if got := ledger.ClampMatch(39.9, 40); got != 0 {
		t.Errorf("ClampMatch(39.9, 40) = %v", got)
	}
}

func TestSessionDelta(t *testing.T) {
	clock := load.NewManualClock(t0)
	s := ledger.NewSessions(2, ledger.Options{Clock: clock})
	ttl := 30 * time.Minute
	type step struct {
		advance    time.Duration
		model, key string
		prompt     int
		want       int
		wantOK     bool
	}
	steps := []step{
		{0, "m", "chat-1", 1000, 0, false},               // first turn: nothing to compare with
		{time.Minute, "m", "chat-1", 1400, 400, true},    // the conversation grew by 400
		{time.Minute, "m", "chat-1", 1900, 500, true},    // and by 500 more
		{0, "other", "chat-1", 2000, 0, false},           // same key, other model: separate
		{0, "m", "chat-1", 1900, 0, false},               // not shorter than the last: no delta
		{0, "m", strings.Repeat("k", 257), 10, 0, false}, // keys over 256 bytes are ignored
		{0, "m", "chat-3", 10, 0, false},                 // table full (2): not recorded
		{0, "m", "chat-3", 20, 0, false},                 // so still no delta
		{ttl, "m", "chat-1", 2500, 0, false},             // expired after the TTL
		{0, "m", "chat-1", 2600, 100, true},              // re-recorded by the last step
	}
	for i, st := range steps {
		clock.Advance(st.advance)
		got, ok := s.Delta(st.model, st.key, st.prompt, ttl)
		if got != st.want || ok != st.wantOK {
			t.Fatalf("step %d (%s/%s %d): %d %v, want %d %v", i, st.model, st.key, st.prompt, got, ok, st.want, st.wantOK)
		}
	}
	if _, ok := s.Delta("m", "chat-1", 5000, 0); ok {
		t.Fatal("session TTL 0 must turn the rule off")
	}
	// The janitor forgets expired sessions, which makes room for new keys.
	clock.Advance(ttl)
	s.Sweep()
	if n := s.Len(); n != 0 {
		t.Fatalf("%d sessions after sweep, want 0", n)
	}
	s.Delta("m", "chat-3", 10, ttl)
	if got, ok := s.Delta("m", "chat-3", 30, ttl); !ok || got != 20 {
		t.Fatalf("after sweep: %d %v, want 20 true", got, ok)
	}
}

func newGauges(t *testing.T) (*telemetry.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := telemetry.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// gauge returns a ledger gauge of ns/pod, or -1 when the series does not exist.
func gauge(t *testing.T, reg *prometheus.Registry, name, ns, pod string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var gotNS, gotPod string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "namespace":
					gotNS = l.GetValue()
				case "pod_name":
					gotPod = l.GetValue()
				}
			}
			if gotNS == ns && gotPod == pod {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

func TestPrefillLifecycle(t *testing.T) {
	clock := load.NewManualClock(t0)
	g, reg := newGauges(t)
	l := ledger.NewPrefill(ledger.Options{Clock: clock, Gauges: g})
	a := ledger.Pod{Namespace: "ns1", Name: "prefill-0"}
	b := ledger.Pod{Namespace: "ns2", Name: "prefill-0"} // same name, other namespace
	check := func(step string, p ledger.Pod, active, kv float64) {
		t.Helper()
		if ga, gk := l.Load(p); ga != active || gk != kv {
			t.Fatalf("%s: %s active %v kv %v, want %v %v", step, p, ga, gk, active, kv)
		}
		if ga := gauge(t, reg, "pd_token_load_active_tokens", p.Namespace, p.Name); ga != active {
			t.Fatalf("%s: active gauge %v, want %v", step, ga, active)
		}
		if gk := gauge(t, reg, "pd_token_load_kv_tokens", p.Namespace, p.Name); gk != kv {
			t.Fatalf("%s: kv gauge %v, want %v", step, gk, kv)
		}
	}
	// 3500 request cost + 1000 prompt tokens, and 3500 + 250.
	c1 := l.Acquire(a, 4500, time.Hour)
	c2 := l.Acquire(a, 3750, time.Hour)
	c3 := l.Acquire(b, 3600, time.Hour)
	check("charged", a, 8250, 8250)
	check("charged, other namespace", b, 3600, 3600)
	c1.ReleaseActive() // prefill leg returned
	c1.ReleaseActive() // idempotent
	check("c1 prefill done", a, 3750, 8250)
	c1.ReleaseKV() // request completed
	c1.ReleaseAll()
	check("c1 done", a, 3750, 3750)
	c2.ReleaseAll() // prefill failed: both parts
	check("c2 failed", a, 0, 0)
	if l.Open() != 1 {
		t.Fatalf("open charges %d, want 1 (c3)", l.Open())
	}

	// TTL: c3 is never released; an hour later the janitor force-releases it.
	clock.Advance(59 * time.Minute)
	l.Sweep()
	check("before TTL", b, 3600, 3600)
	clock.Advance(time.Minute)
	l.Sweep()
	check("force-released at TTL", b, 0, 0)
	c3.ReleaseAll() // a late release must not go below zero
	check("late release", b, 0, 0)

	// Pod a has been at zero since the start + 0: idle for an hour, forgotten with its series.
	// Pod b was touched by the force-release just now: kept until a minute passes.
	l.Sweep()
	if got := gauge(t, reg, "pd_token_load_active_tokens", a.Namespace, a.Name); got != -1 {
		t.Fatalf("idle pod a still has a series (%v)", got)
	}
	if got := gauge(t, reg, "pd_token_load_kv_tokens", b.Namespace, b.Name); got != 0 {
		t.Fatalf("pod b series %v, want 0 (touched less than a minute ago)", got)
	}
	clock.Advance(ledger.IdleAfter)
	l.Sweep()
	if got := gauge(t, reg, "pd_token_load_kv_tokens", b.Namespace, b.Name); got != -1 || len(l.Pods()) != 0 {
		t.Fatalf("pod b not forgotten: series %v, pods %v", got, l.Pods())
	}
	// The next charge re-creates a forgotten pod from zero.
	l.Acquire(a, 10, 0)
	check("re-created", a, 10, 10)
}

func TestDecodeLedgerGrowth(t *testing.T) {
	clock := load.NewManualClock(t0)
	g, reg := newGauges(t)
	l := ledger.NewDecode(ledger.Options{Clock: clock, Gauges: g})
	d := ledger.Pod{Namespace: "ns", Name: "decode-0"}
	c1 := l.Acquire(d, 1000, time.Hour) // routed at t0
	clock.Advance(10 * time.Second)
	c2 := l.Acquire(d, 3000, time.Hour) // routed at t0+10s
	clock.Advance(10 * time.Second)
	// Σ(now − routed_at) = 20 + 10 = 30 s; at 2 tokens/s per request: 60 generated tokens.
	cases := []struct {
		rate   float64
		growth bool
		want   float64
	}{
		{2, true, 4060},
		{2, false, 4000}, // AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH=false
		{0, true, 4000},
	}
	for _, tc := range cases {
		if got := l.Load(d, tc.rate, tc.growth); math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("rate %v growth %v: %v, want %v", tc.rate, tc.growth, got, tc.want)
		}
	}
	if got := gauge(t, reg, "pd_token_load_decode_tokens", "ns", "decode-0"); got != 4000 {
		t.Fatalf("decode gauge %v, want 4000", got)
	}
	c1.Release()
	c1.Release()
	// Only c2 left: 3000 tokens, routed 10 s ago: 3000 + 2·10.
	if got := l.Load(d, 2, true); math.Abs(got-3020) > 1e-6 {
		t.Fatalf("after release: %v, want 3020", got)
	}
	// A remote replica's charges add to the score: 500 tokens, 2 requests totalling 15 s.
	l.SetRemote(remote{d: {Tokens: 500, Count: 2, Elapsed: 15}})
	if got := l.Load(d, 2, true); math.Abs(got-(3500+2*25)) > 1e-6 {
		t.Fatalf("with remote: %v, want 3550", got)
	}
	l.SetRemote(nil)
	c2.Release()
	if tok, n, el := l.Local(d); tok != 0 || n != 0 || el != 0 {
		t.Fatalf("after releases: %v tokens, %d charges, %v s", tok, n, el)
	}
	// TTL force-release and idle forgetting, as for prefill.
	l.Acquire(d, 700, time.Minute)
	clock.Advance(time.Minute)
	l.Sweep()
	if tok, _, _ := l.Local(d); tok != 0 {
		t.Fatalf("TTL: %v tokens left", tok)
	}
	clock.Advance(ledger.IdleAfter)
	l.Sweep()
	if got := gauge(t, reg, "pd_token_load_decode_tokens", "ns", "decode-0"); got != -1 {
		t.Fatalf("idle decode pod still has a series: %v", got)
	}
}

type remote map[ledger.Pod]ledger.RemoteLoad

func (r remote) Remote(p ledger.Pod) ledger.RemoteLoad { return r[p] }

// Many goroutines charge and release concurrently (run with -race); the ledgers must end
// at exactly zero.
func TestConcurrentChargesEndAtZero(t *testing.T) {
	clock := load.NewManualClock(t0)
	g, _ := newGauges(t)
	pre := ledger.NewPrefill(ledger.Options{Clock: clock, Gauges: g})
	dec := ledger.NewDecode(ledger.Options{Clock: clock, Gauges: g})
	pods := []ledger.Pod{{"ns", "a"}, {"ns", "b"}, {"ns", "c"}}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 500 {
				p := pods[(w+i)%len(pods)]
				pc := pre.Acquire(p, float64(3500+i*7), time.Hour)
				dc := dec.Acquire(p, float64(i*13+1), time.Hour)
				_, _ = pre.Load(pods[i%len(pods)])
				_ = dec.Load(pods[i%len(pods)], 1.5, true)
				if i%3 == 0 {
					clock.Advance(time.Millisecond)
					pre.Sweep()
					dec.Sweep()
				}
				pc.ReleaseActive()
				if i%2 == 0 {
					pc.ReleaseAll()
				} else {
					pc.ReleaseKV()
				}
				dc.Release()
			}
		})
	}
	wg.Wait()
	for _, p := range pods {
		a, kv := pre.Load(p)
		tok, n, el := dec.Local(p)
		if a != 0 || kv != 0 || tok != 0 || n != 0 || el != 0 {
			t.Errorf("%s: active %v kv %v decode %v/%d/%v, want all 0", p, a, kv, tok, n, el)
		}
	}
	if pre.Open() != 0 || dec.Open() != 0 {
		t.Fatalf("open charges: %d prefill, %d decode", pre.Open(), dec.Open())
	}
}

var _ ledger.Gauges = (*telemetry.Metrics)(nil)
