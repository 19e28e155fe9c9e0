package pd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// tlHarness is a cascade with the token-load policies registered, behind the real Router,
// on a manual clock.
type tlHarness struct {
	t      *testing.T
	clock  *load.ManualClock
	deps   *picker.Deps
	c      *pd.Cascade
	tl     *pd.TokenLoad
	router *picker.Router
	store  *pool.Store
	eps    map[string]*pool.Endpoint
}

// newTL builds the harness over pods given as "name:role:roleset" or
// "name:role:roleset:maxPromptLen" (a declared bucket range [0, max]).
func newTL(t *testing.T, mut func(*config.PD), pods ...string) *tlHarness {
	t.Helper()
	return newTLWith(t, mut, nil, "", pods...)
}

// newTLWith also takes step 2b's preference and a model.aibrix.ai/config annotation for
// every pod (overridden by a pod's maxPromptLen field).
func newTLWith(t *testing.T, mut func(*config.PD), prefer pd.RolesetPreference, annotation string, pods ...string) *tlHarness {
	t.Helper()
	gw := config.DefaultPD()
	gw.PrefixCache.BlockSize = 4 // 16-byte blocks: short prompts still hash
	if mut != nil {
		mut(&gw)
	}
	clock := load.NewManualClock(time.Unix(1_700_000_000, 0))
	deps := picker.NewDeps(clock, gw.PrefixCache)
	h := &tlHarness{t: t, clock: clock, deps: deps, store: pool.NewStore(), eps: map[string]*pool.Endpoint{}}
	h.tl = pd.NewTokenLoad(gw, ledger.Options{Clock: clock})
	h.c = pd.New(pd.Options{Deps: deps, Gateway: gw, Preference: prefer, TokenLoad: h.tl})
	res, err := config.NewResolver(config.Gateway{PD: gw, DefaultStrategy: pd.StrategyName}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.router, err = picker.NewRouter(picker.RouterOptions{Resolver: res, Strategies: pd.Strategies(h.c, deps, gw)})
	if err != nil {
		t.Fatal(err)
	}
	var eps []*pool.Endpoint
	for i, spec := range pods {
		f := strings.Split(spec, ":")
		labels := map[string]string{pool.LabelModelName: "m", pool.LabelRoleName: f[1], pool.LabelRolesetName: f[2]}
		ann := map[string]string{}
		if annotation != "" {
			ann[pool.AnnotationConfig] = annotation
		}
		if len(f) > 3 {
			ann[pool.AnnotationConfig] = `{"profiles": {"default": {"routingConfig": {"promptLenBucketMaxLength": ` + f[3] + `}}}}`
		}
		e := pool.NewEndpoint("ns", f[0], fmt.Sprintf("10.0.0.%d", i+1), 8000, 0, labels, ann)
		h.eps[f[0]] = e
		eps = append(eps, e)
	}
	h.store.Publish(pool.Info{Name: "pool"}, eps, true)
	return h
}

func (h *tlHarness) pod(name string) ledger.Pod { return ledger.PodOf(h.eps[name]) }

// req builds a completions request whose body is exactly 4·tokens bytes (BodyTokens = tokens).
func tlReq(t *testing.T, seed string, tokens int, headers map[string]string) *request.Request {
	t.Helper()
	const overhead = len(`{"model":"m","prompt":""}`)
	n := 4*tokens - overhead
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(seed)
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": b.String()[:n]})
	hd := map[string]string{}
	for k, v := range headers {
		hd[k] = v
	}
	r, err := request.Parse("POST", "/v1/completions", hd, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.BodyTokens != tokens {
		t.Fatalf("body tokens %d, want %d", r.BodyTokens, tokens)
	}
	return r
}

func (h *tlHarness) pick(r *request.Request) *picker.Decision {
	h.t.Helper()
	snap := h.store.Load()
	d, err := h.router.Schedule(context.Background(), r, snap, snap.Endpoints)
	if err != nil {
		h.t.Fatalf("pick: %v", err)
	}
	return d
}

func (h *tlHarness) prefillLoad(name string) (float64, float64) {
	return h.tl.Prefill.Load(h.pod(name))
}

// token_load sends each request to the prefill pod with the lowest active + 0.3·kv, so one
// long prompt weighs as much as many short ones.
func TestTokenLoadSpreadsByTokens(t *testing.T) {
	h := newTL(t, func(g *config.PD) {
		g.PrefillScorePolicy = pd.PolicyTokenLoad
		g.DecodeScorePolicy = pd.PolicyLeastRequest
	},
		"p0:prefill:A", "p1:prefill:A", "d0:decode:A")
	// One 10000-token prompt: charge 3500 + 10000 = 13500 to whichever pod takes it.
	long := h.pick(tlReq(t, "long ", 10000, nil))
	busy, idle := long.Prefill[0].Name, "p0"
	if busy == "p0" {
		idle = "p1"
	}
	if a, kv := h.prefillLoad(busy); a != 13500 || kv != 13500 {
		t.Fatalf("long prompt charged %v/%v, want 13500/13500", a, kv)
	}
	// 100-token prompts charge 3600 each. The idle pod takes them while its score is lower:
	// 1.3·3600·k < 1.3·13500 for k = 0..3, so four go there; the fifth goes to the busy pod
	// (13500 < 14400).
	want := []string{idle, idle, idle, idle, busy}
	for i, w := range want {
		d := h.pick(tlReq(t, "short ", 100, nil))
		if got := d.Prefill[0].Name; got != w {
			a0, _ := h.prefillLoad("p0")
			a1, _ := h.prefillLoad("p1")
			t.Fatalf("short prompt %d went to %s, want %s (p0 %v, p1 %v)", i, got, w, a0, a1)
		}
	}
	if a, _ := h.prefillLoad(idle); a != 4*3600 {
		t.Fatalf("idle pod ledger %v, want 14400", a)
	}
	if a, _ := h.prefillLoad(busy); a != 13500+3600 {
		t.Fatalf("busy pod ledger %v, want 17100", a)
	}
}

// hybrid_cache_load: between idle pods the prefix match decides; between busy ones, the load.
func TestHybridCacheLoadCacheThenLoad(t *testing.T) {
	h := newTL(t, func(g *config.PD) {
		g.PrefillScorePolicy = pd.PolicyHybridCacheLoad
		g.DecodeScorePolicy = pd.PolicyLeastRequest
	},
		"p0:prefill:A", "p1:prefill:A", "d0:decode:A")
	prompt := func() *request.Request { return tlReq(t, "shared system prompt ", 500, nil) }
	// 1: both idle, no match: a tie. The chosen pod X is charged the whole prompt
	// (3500 + 500; a 0% match leaves all of it) and then warmed with the prompt.
	d1 := h.pick(prompt())
	x := d1.Prefill[0].Name
	y := map[string]string{"p0": "p1", "p1": "p0"}[x]
	if a, _ := h.prefillLoad(x); a != 4000 {
		t.Fatalf("first charge %v, want 4000", a)
	}
	d1.Lifecycle.Done(nil)
	// 2: both idle again; X holds the whole prompt: discount 1 − 1²·0.5 = 0.5 < 1 → X,
	// charged only the request cost (a full match leaves no new tokens).
	d2 := h.pick(prompt())
	if got := d2.Prefill[0].Name; got != x {
		t.Fatalf("idle pods: %s, want the cached pod %s", got, x)
	}
	if a, kv := h.prefillLoad(x); a != 3500 || kv != 3500 {
		t.Fatalf("full-match charge %v/%v, want 3500/3500", a, kv)
	}
	// 3: X is busy: 1.3·3500·0.5 = 2275 against Y idle at 1 → Y, charged the whole prompt.
	d3 := h.pick(prompt())
	if got := d3.Prefill[0].Name; got != y {
		t.Fatalf("busy cached pod: %s, want the idle pod %s", got, y)
	}
	if a, _ := h.prefillLoad(y); a != 4000 {
		t.Fatalf("idle pod charge %v, want 4000", a)
	}
}

// The hybrid score and charge read the per-request knobs: MinMatchPct applies to both.
func TestHybridPolicyTable(t *testing.T) {
	h := newTL(t, nil, "p0:prefill:A", "p1:prefill:A", "d0:decode:A")
	pol, ok := h.c.Policies().Prefill(pd.PolicyHybridCacheLoad)
	if !ok {
		t.Fatal("hybrid_cache_load not registered")
	}
	p0, p1 := h.eps["p0"], h.eps["p1"]
	h.tl.Prefill.Acquire(h.pod("p0"), 1000, 0) // p0 load: 1000 + 0.3·1000 = 1300
	k := config.DefaultPD()
	k50 := k
	k50.MinMatchPct = 50
	cases := []struct {
		name        string
		knobs       *config.PD
		match0      float64 // p0's match
		match1      float64 // p1's match (idle)
		want0       float64
		want1       float64
		wantCharge1 float64 // charge if p1 is chosen for a 1000-token request
	}{
		{"70% on busy p0: 1300·0.755", &k, 70, 0, 981.5, 1, 4500},
		{"30% on idle p1: bare discount 0.955", &k, 0, 30, 1300, 0.955, 3500 + 700},
		{"min match 50 ignores a 30% match in score and charge", &k50, 30, 30, 1300, 1, 4500},
		{"min match 50 keeps a 60% match", &k50, 0, 60, 1300, 0.82, 3500 + 400},
	}
	for _, tc := range cases {
		b := &pd.PrefillBatch{Knobs: tc.knobs, MaxInFlight: 1, Pods: []pd.PrefillPod{
			{Endpoint: p0, Roleset: "A", MatchPct: tc.match0}, {Endpoint: p1, Roleset: "A", MatchPct: tc.match1}}}
		s0, s1 := pol.Score(b, 0), pol.Score(b, 1)
		if math.Abs(s0-tc.want0) > 1e-9 || math.Abs(s1-tc.want1) > 1e-9 {
			t.Errorf("%s: scores %v %v, want %v %v", tc.name, s0, s1, tc.want0, tc.want1)
		}
		release, done := pol.(pd.Charger).Charge(tlReq(t, "x", 1000, nil), p1, h.eps["d0"])
		if a, _ := h.prefillLoad("p1"); a != tc.wantCharge1 {
			t.Errorf("%s: charge %v, want %v", tc.name, a, tc.wantCharge1)
		}
		release()
		done()
	}
}

// Session delta: the second turn of a conversation is charged its growth only.
func TestSessionDeltaCharge(t *testing.T) {
	h := newTL(t, func(g *config.PD) {
		g.PrefillScorePolicy = pd.PolicyTokenLoad
		g.DecodeScorePolicy = pd.PolicyLeastRequest
	},
		"p0:prefill:A", "d0:decode:A")
	sess := map[string]string{request.HeaderSessionKey: "conv-1"}
	turns := []struct {
		tokens  int
		headers map[string]string
		advance time.Duration
		want    float64
	}{
		{1000, sess, 0, 4500},                 // first turn: 3500 + whole prompt
		{1600, sess, time.Minute, 3500 + 600}, // second turn: 3500 + growth 600
		{1600, nil, 0, 3500 + 1600},           // no session key: whole prompt
		{2000, sess, 30 * time.Minute, 5500},  // the session expired (TTL 1800 s): whole prompt
	}
	for i, tc := range turns {
		h.clock.Advance(tc.advance)
		d := h.pick(tlReq(t, "conversation ", tc.tokens, tc.headers))
		if a, _ := h.prefillLoad("p0"); a != tc.want {
			t.Fatalf("turn %d: charged %v, want %v", i, a, tc.want)
		}
		d.Lifecycle.Done(nil)
	}
}

// Lifecycle: active goes when the prefill leg ends — PrefillDone (EPP hand-off) or the decode
// leg's response headers (sidecar hand-off) —, kv and the decode charge at Done; idempotent.
func TestTokenLoadLifecycle(t *testing.T) {
	h := newTL(t, func(g *config.PD) {
		g.PrefillScorePolicy = pd.PolicyTokenLoad
		g.DecodeScorePolicy = pd.PolicyTokenLoad
	},
		"p0:prefill:A", "d0:decode:A")
	state := func() [3]float64 {
		a, kv := h.prefillLoad("p0")
		dec, _, _ := h.tl.Decode.Local(h.pod("d0"))
		return [3]float64{a, kv, dec}
	}
	for _, mode := range []string{"sidecar", "epp"} {
		d := h.pick(tlReq(t, "x", 1000, nil))
		if got := state(); got != [3]float64{4500, 4500, 1000} {
			t.Fatalf("%s: after pick %v", mode, got)
		}
		for range 2 {
			if mode == "sidecar" {
				d.Lifecycle.ResponseHeaders(200, nil)
			} else {
				d.Lifecycle.(pd.PrefillObserver).PrefillDone(nil)
			}
		}
		if got := state(); got != [3]float64{0, 4500, 1000} {
			t.Fatalf("%s: after the prefill leg %v, want active released only", mode, got)
		}
		d.Lifecycle.Done(nil)
		d.Lifecycle.Done(nil)
		if got := state(); got != [3]float64{0, 0, 0} {
			t.Fatalf("%s: after done %v", mode, got)
		}
	}
	// A failed prefill call releases the kv part and the decode charge at once.
	d := h.pick(tlReq(t, "x", 1000, nil))
	d.Lifecycle.(pd.PrefillObserver).PrefillDone(errors.New("prefill: 503"))
	if got := state(); got != [3]float64{0, 0, 0} {
		t.Fatalf("prefill failed: %v, want everything released", got)
	}
	d.Lifecycle.Done(errors.New("prefill: 503"))
	if got := state(); got != [3]float64{0, 0, 0} {
		t.Fatalf("prefill failed, then done: %v", got)
	}
	// A request that ends before any response (client cancel) releases everything at Done.
	d = h.pick(tlReq(t, "x", 1000, nil))
	d.Lifecycle.Done(context.Canceled)
	if got := state(); got != [3]float64{0, 0, 0} {
		t.Fatalf("cancelled: %v", got)
	}
}

// Decode token_load: hand-worked scores (decode_tokens + rate·Σ elapsed), the mean rate for
// a pod without its own, and growth off.
func TestDecodeTokenLoadScores(t *testing.T) {
	h := newTL(t, nil, "p0:prefill:A", "d1:decode:A", "d2:decode:A", "d3:decode:A")
	pol, ok := h.c.Policies().Decode(pd.PolicyTokenLoad)
	if !ok || pol.FastPath() || pol.ColdStart() {
		t.Fatalf("decode token_load: registered %v, fast path %v, cold start %v", ok, pol.FastPath(), pol.ColdStart())
	}
	// Charged at t0: d1 1000 tokens, d2 3000, d3 (no metrics) 1000.
	h.tl.Decode.Acquire(h.pod("d1"), 1000, 0)
	h.tl.Decode.Acquire(h.pod("d2"), 3000, 0)
	h.tl.Decode.Acquire(h.pod("d3"), 1000, 0)
	h.clock.Advance(50 * time.Second)
	k := config.DefaultPD()
	kOff := k
	kOff.DecodeTokenLoadOutputGrowth = false
	// d1: 1000 tok/s over 10 running = 100/s per request; d2: 100 tok/s over 10 = 10/s;
	// d3: no rate of its own → mean(100, 10) = 55/s.
	pods := []pd.DecodePod{
		{Endpoint: h.eps["d1"], Running: 10, HasRunning: true, Throughput: 1000, HasThroughput: true},
		{Endpoint: h.eps["d2"], Running: 10, HasRunning: true, Throughput: 100, HasThroughput: true},
		{Endpoint: h.eps["d3"]},
	}
	cases := []struct {
		knobs *config.PD
		want  [3]float64
	}{
		{&k, [3]float64{1000 + 100*50, 3000 + 10*50, 1000 + 55*50}},
		{&kOff, [3]float64{1000, 3000, 1000}},
	}
	for _, tc := range cases {
		b := &pd.DecodeBatch{Pods: pods, Knobs: tc.knobs, MaxRequests: 10, MaxThroughput: 1000, MaxFreeGPU: 100}
		for i := range pods {
			if got := pol.Score(b, i); math.Abs(got-tc.want[i]) > 1e-6 {
				t.Errorf("growth %v pod %d: %v, want %v", tc.knobs.DecodeTokenLoadOutputGrowth, i, got, tc.want[i])
			}
		}
	}
}

// Under decode token_load the request-spread fast path does not decide, and a pod without
// metrics competes on its ledger instead of the cold-start score.
func TestDecodeTokenLoadSkipsFastPath(t *testing.T) {
	for _, tc := range []struct {
		policy   string
		wantStep string
	}{
		{pd.PolicyLoadBalancing, pd.StepDecodeRequests},
		{pd.PolicyTokenLoad, pd.StepPair},
	} {
		h := newTL(t, func(g *config.PD) { g.PrefillScorePolicy = pd.PolicyLeastRequest; g.DecodeScorePolicy = tc.policy },
			"p0:prefill:A", "d0:decode:A", "d1:decode:A", "d2:decode:A")
		// d0 is idle by request count but holds a 50000-token prompt; d1 runs 20 requests;
		// d2 has no metrics yet.
		h.deps.Running.Start(h.eps["d0"].Key())()
		for range 20 {
			h.deps.Running.Start(h.eps["d1"].Key())
		}
		h.tl.Decode.Acquire(h.pod("d0"), 50000, 0)
		for range 10 {
			d := h.pick(tlReq(t, "x", 100, nil))
			dst := d.Destination[0].Name
			if d.Step != tc.wantStep {
				t.Fatalf("%s: step %s, want %s", tc.policy, d.Step, tc.wantStep)
			}
			if tc.policy == pd.PolicyTokenLoad && dst == "d0" {
				t.Fatalf("token_load sent a request to d0, which holds 50000 tokens")
			}
			if tc.policy == pd.PolicyLoadBalancing && dst != "d0" {
				t.Fatalf("load_balancing: spread 20 ≥ 16 should pick d0, got %s", dst)
			}
			d.Lifecycle.Done(nil)
		}
	}
}

// Many goroutines pick and release concurrently (run with -race); every ledger ends at
// exactly zero and concurrent picks saw each other's charges.
func TestTokenLoadConcurrentPicks(t *testing.T) {
	h := newTL(t, func(g *config.PD) {
		g.PrefillScorePolicy = pd.PolicyHybridCacheLoad
		g.DecodeScorePolicy = pd.PolicyTokenLoad
	},
		"p0:prefill:A", "p1:prefill:A", "d0:decode:A", "p2:prefill:B", "d1:decode:B", "d2:decode:B")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []*picker.Decision
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range 60 {
				hd := map[string]string{}
				if i%4 == 0 {
					hd[request.HeaderSessionKey] = fmt.Sprintf("s-%d", w)
				}
				d := h.pick(tlReq(t, fmt.Sprintf("w%d ", i%5), 50+rng.IntN(400), hd))
				switch rng.IntN(3) {
				case 0:
					d.Lifecycle.ResponseHeaders(200, nil)
					d.Lifecycle.Done(nil)
				case 1:
					d.Lifecycle.(pd.PrefillObserver).PrefillDone(nil)
					d.Lifecycle.Done(nil)
				default:
					mu.Lock()
					held = append(held, d) // released later, from another goroutine
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	var busy float64
	for _, p := range []string{"p0", "p1", "p2"} {
		a, _ := h.prefillLoad(p)
		busy += a
	}
	if len(held) > 0 && busy == 0 {
		t.Fatal("held requests left no prefill load")
	}
	for _, d := range held {
		wg.Go(func() { d.Lifecycle.Done(nil) })
	}
	wg.Wait()
	for _, p := range []string{"p0", "p1", "p2"} {
		if a, kv := h.prefillLoad(p); a != 0 || kv != 0 {
			t.Errorf("%s: active %v kv %v, want 0", p, a, kv)
		}
	}
	for _, p := range []string{"d0", "d1", "d2"} {
		if tok, n, _ := h.tl.Decode.Local(h.pod(p)); tok != 0 || n != 0 {
			t.Errorf("%s: %v tokens, %d charges, want 0", p, tok, n)
		}
	}
	if h.tl.Prefill.Open() != 0 || h.tl.Decode.Open() != 0 {
		t.Fatalf("open charges: %d prefill, %d decode", h.tl.Prefill.Open(), h.tl.Decode.Open())
	}
}

var _ = metrics.Sample{}

// Per-profile knobs: the profile a request resolves to sets its charge (request cost, session
// TTL), chosen with the config-profile header.
func TestTokenLoadProfileKnobs(t *testing.T) {
	ann := `{"defaultProfile": "default", "profiles": {
		"default": {"routingStrategy": "pd", "routingConfig": {"prefillScorePolicy": "token_load", "pd": {"tokenLoadRequestCost": 100}}},
		"heavy": {"routingStrategy": "pd", "routingConfig": {"prefillScorePolicy": "token_load", "pd": {"tokenLoadRequestCost": 9000, "tokenLoadSessionTTLSeconds": 0}}}}}`
	h := newTLWith(t, func(g *config.PD) { g.DecodeScorePolicy = pd.PolicyLeastRequest }, nil, ann, "p0:prefill:A", "d0:decode:A")
	cases := []struct {
		headers map[string]string
		want    float64
	}{
		{nil, 100 + 1000},
		{map[string]string{"config-profile": "heavy"}, 9000 + 1000},
		// heavy turns the session rule off: a growing conversation is charged whole.
		{map[string]string{"config-profile": "heavy", request.HeaderSessionKey: "c"}, 9000 + 1000},
		{map[string]string{"config-profile": "heavy", request.HeaderSessionKey: "c"}, 9000 + 1000},
		// default keeps it (TTL 1800 s): first turn whole, second the growth of 0 → no delta.
		{map[string]string{request.HeaderSessionKey: "c"}, 100 + 1000},
	}
	for i, tc := range cases {
		d := h.pick(tlReq(t, "x", 1000, tc.headers))
		if a, _ := h.prefillLoad("p0"); a != tc.want {
			t.Fatalf("case %d: charged %v, want %v (trace %+v)", i, a, tc.want, d.Trace)
		}
		d.Lifecycle.Done(nil)
	}
	d := h.pick(tlReq(t, "x", 1500, map[string]string{request.HeaderSessionKey: "c"}))
	if a, _ := h.prefillLoad("p0"); a != 100+500 {
		t.Fatalf("default profile session delta: charged %v, want 600", a)
	}
	d.Lifecycle.Done(nil)
}

// A completions prompt of token ids is as long as its ids: bucketing compares that length with
// the ranges, and token_load charges it (not a quarter of the ids' JSON bytes, which here would
// be about 1750).
func TestTokenIDPromptLengthAndCharges(t *testing.T) {
	h := newTL(t, func(g *config.PD) {
		g.PrefillScorePolicy = pd.PolicyTokenLoad
		g.DecodeScorePolicy = pd.PolicyTokenLoad
		g.PromptLengthBucketing = true
	},
		"p0:prefill:A:1200", "d0:decode:A:1200", "p1:prefill:B:800", "d1:decode:B:800")
	ids := make([]int, 1000)
	for i := range ids {
		ids[i] = 100000 + i
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids, "max_tokens": 4})
	r, err := request.Parse("POST", "/v1/completions", map[string]string{}, body)
	if err != nil {
		t.Fatal(err)
	}
	if len(body)/4 < 1700 {
		t.Fatalf("the body is %d bytes: the example must make bytes/4 differ from the length", len(body))
	}
	d := h.pick(r)
	if d.Prefill[0].Name != "p0" || d.Destination[0].Name != "d0" {
		t.Fatalf("picked %s/%s, want roleset A, whose bucket (≤1200) holds 1000 tokens", d.Prefill[0].Name, d.Destination[0].Name)
	}
	active, kv := h.prefillLoad("p0")
	dec, _, _ := h.tl.Decode.Local(h.pod("d0"))
	if active != 3500+1000 || kv != 3500+1000 || dec != 1000 {
		t.Fatalf("charges active %v kv %v decode %v; want 4500, 4500 and 1000 (the prompt's 1000 tokens)", active, kv, dec)
	}
	d.Lifecycle.Done(nil)
}
