package config

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

func ep(name, model, annotation string) *pool.Endpoint {
	labels := map[string]string{}
	if model != "" {
		labels[pool.LabelModelName] = model
	}
	ann := map[string]string{}
	if annotation != "" {
		ann[pool.AnnotationConfig] = annotation
	}
	return pool.NewEndpoint("ns", name, "10.0.0."+fmt.Sprint(len(name)), 8000, 0, labels, ann)
}

type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) BadAnnotation(podKey, field, value string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, podKey+" "+field+" | "+err.Error())
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	return out
}

func newResolver(t testing.TB, gw Gateway, rep Reporter) *Resolver {
	t.Helper()
	r, err := NewResolver(gw, Options{Reporter: rep})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Strategy precedence: lockedRoutingStrategy > routing-strategy header > profile > gateway default.
func TestStrategyPrecedence(t *testing.T) {
	cases := []struct {
		locked, header, profile string
		want                    string
		source                  StrategySource
		err                     bool
	}{
		{"", "", "", "", SourceGateway, false}, // unset ROUTING_ALGORITHM: the picker chooses
		{"", "", "pd", "pd", SourceProfile, false},
		{"", "random", "", "random", SourceHeader, false},
		{"", "random", "pd", "random", SourceHeader, false},
		{"", " Random ", "pd", "random", SourceHeader, false},
		{"pd", "", "", "pd", SourceLocked, false},
		{"pd", "random", "", "pd", SourceLocked, false},
		{"pd", "random", "prefix-cache", "pd", SourceLocked, false},
		{"pd", "bogus", "random", "pd", SourceLocked, false}, // locked: the header is not read at all
		{"", "bogus", "pd", "", "", true},
		{"", "bogus", "", "", "", true},
	}
	for _, c := range cases {
		name := fmt.Sprintf("locked=%q header=%q profile=%q", c.locked, c.header, c.profile)
		ann := `{"profiles":{"default":{}}}`
		if c.locked != "" || c.profile != "" {
			ann = fmt.Sprintf(`{"lockedRoutingStrategy":%q,"profiles":{"default":{"routingStrategy":%q}}}`, c.locked, c.profile)
			ann = strings.ReplaceAll(strings.ReplaceAll(ann, `"lockedRoutingStrategy":"",`, ""), `"routingStrategy":""`, "")
		}
		rec := &recorder{}
		r := newResolver(t, DefaultGateway(), rec)
		headers := map[string]string{}
		if c.header != "" {
			headers[wire.HeaderRoutingStrategy] = c.header
		}
		got, err := r.ResolveEndpoints(headers, []*pool.Endpoint{ep("a", "m", ann)})
		if c.err {
			var ae *apierror.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest ||
				ae.Message != `unknown routing strategy "bogus" in the routing-strategy header; valid strategies: least-request, pd, pd-predictive, prefix-cache, random` {
				t.Errorf("%s: want a 400 listing the strategies, got %v", name, err)
			}
			continue
		}
		if err != nil || got.Strategy != c.want || got.StrategySource != c.source {
			t.Errorf("%s: got %q (%s) %v, want %q (%s)", name, got.Strategy, got.StrategySource, err, c.want, c.source)
		}
		if r := rec.take(); len(r) > 0 {
			t.Errorf("%s: unexpected reports %v", name, r)
		}
	}
}

// The strategy set comes from the picker registry.
func TestResolverUsesRegistryStrategies(t *testing.T) {
	gw := DefaultGateway()
	gw.DefaultStrategy = "pd"
	r, err := NewResolver(gw, Options{Names: Names{Strategies: []string{"pd", "weighted"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.ResolveEndpoints(map[string]string{wire.HeaderRoutingStrategy: "weighted"}, nil); err != nil || got.Strategy != "weighted" {
		t.Errorf("registered strategy: %v %v", got, err)
	}
	_, err = r.ResolveEndpoints(map[string]string{wire.HeaderRoutingStrategy: "random"}, nil)
	if err == nil || !strings.Contains(err.Error(), "valid strategies: pd, weighted") {
		t.Errorf("unregistered strategy: %v", err)
	}
	// Start-up: the gateway default and policies must exist in the registries.
	gw.DefaultStrategy = "fancy"
	gw.PD.DecodeScorePolicy = "token_load"
	_, err = NewResolver(gw, Options{Names: Names{Strategies: []string{"pd"}, DecodePolicies: []string{"load_balancing"}}})
	want := "2 configuration problems:\n  ROUTING_ALGORITHM=fancy: must be one of pd\n  AIBRIX_DECODE_SCORE_POLICY=token_load: must be one of load_balancing"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}

const profilesAnn = `{
  "defaultProfile": "chat",
  "profiles": {
    "chat": {"routingStrategy": "pd", "routingConfig": {"promptLenBucketMaxLength": 2048, "prefillScorePolicy": "least_request"}},
    "long": {"routingStrategy": "pd", "routingConfig": {"promptLenBucketMinLength": 2048, "decodeScorePolicy": "conductor",
             "handoff": "epp", "transferProof": "strict", "pd": {"prefillRequestTimeout": 120, "decodeStreamIdleTimeout": 0, "tokenLoadKVWeight": 0.5,
             "decodeWatchdogEngines": ["vllm", "sglang"]}}},
    "batch": {"routingStrategy": "random"}
  }
}`

// Profile selection: config-profile header, else defaultProfile, else "default".
func TestProfileSelection(t *testing.T) {
	r := newResolver(t, DefaultGateway(), nil)
	eps := []*pool.Endpoint{ep("a", "m", profilesAnn)}
	cases := []struct{ header, wantProfile, wantStrategy string }{
		{"", "chat", "pd"},
		{"long", "long", "pd"},
		{"batch", "batch", "random"},
		{"missing", "chat", "pd"}, // unknown profile: the default one
		{" long ", "long", "pd"},
	}
	for _, c := range cases {
		got, err := r.ResolveEndpoints(map[string]string{wire.HeaderConfigProfile: c.header}, eps)
		if err != nil || got.ProfileName != c.wantProfile || got.Strategy != c.wantStrategy || got.ConfigPod != "ns/a" ||
			got.RequestedProfile != strings.TrimSpace(c.header) {
			t.Errorf("header %q: got %s %v", c.header, got, err)
		}
	}
	// Without defaultProfile the default is "default"; without any annotation, too.
	got, _ := r.ResolveEndpoints(nil, []*pool.Endpoint{ep("b", "m", `{"profiles":{"default":{"routingStrategy":"random"},"x":{}}}`)})
	if got.ProfileName != "default" || got.Strategy != "random" {
		t.Errorf("implicit default: %s", got)
	}
	got, _ = r.ResolveEndpoints(map[string]string{wire.HeaderConfigProfile: "x"}, []*pool.Endpoint{ep("c", "m", "")})
	if got.ProfileName != "default" || got.ConfigPod != "" || got.StrategySource != SourceGateway {
		t.Errorf("no annotation: %s", got)
	}
}

// The profile's routingConfig fields and pd overrides apply on top of the gateway PD.
func TestProfilePDOverrides(t *testing.T) {
	gw := DefaultGateway()
	gw.PD.PrefillRequestTimeout = 20 * time.Second
	r := newResolver(t, gw, nil)
	eps := []*pool.Endpoint{ep("a", "m", profilesAnn)}

	chat, _ := r.ResolveEndpoints(nil, eps)
	if chat.PrefillScorePolicy != "least_request" || chat.DecodeScorePolicy != "load_balancing" ||
		chat.PD.PrefillRequestTimeout != 20*time.Second || chat.Handoff != HandoffAuto || chat.Routing.PromptLenBucketMaxLength != 2048 ||
		chat.PD.TransferProof != TransferProofLenient {
		t.Errorf("chat: %+v", chat)
	}
	long, _ := r.ResolveEndpoints(map[string]string{wire.HeaderConfigProfile: "long"}, eps)
	want := gw.PD
	want.DecodeScorePolicy = "conductor"
	want.Handoff = "epp"
	want.TransferProof = TransferProofStrict
	want.PrefillRequestTimeout = 120 * time.Second
	want.DecodeStreamIdleTimeout = 0
	want.TokenLoadKVWeight = 0.5
	want.DecodeWatchdogEngines = EngineSetOf("sglang", "vllm")
	if long.PD != want || long.DecodeScorePolicy != "conductor" || long.Handoff != "epp" {
		t.Errorf("long PD\n got %+v\nwant %+v", long.PD, want)
	}
	// The gateway PD itself is untouched.
	if r.Gateway().PD != gw.PD {
		t.Error("resolving a profile changed the gateway PD")
	}
}

func TestProfileBucketServeNeedsBucketing(t *testing.T) {
	rec := &recorder{}
	r := newResolver(t, DefaultGateway(), rec)
	eps := []*pool.Endpoint{ep("a", "m", `{"profiles":{"default":{"routingConfig":{"bucketServe":true}},"b":{"routingConfig":{"bucketServe":true,"promptLengthBucketing":true}}}}`)}
	got, _ := r.ResolveEndpoints(nil, eps)
	if got.PD.BucketServe {
		t.Error("bucketServe without bucketing must be rejected")
	}
	if reps := rec.take(); len(reps) != 1 || !strings.Contains(reps[0], "profiles.default.routingConfig.bucketServe=true: needs prompt-length bucketing") {
		t.Errorf("reports %v", reps)
	}
	got, _ = r.ResolveEndpoints(map[string]string{wire.HeaderConfigProfile: "b"}, eps)
	if !got.PD.BucketServe || !got.PD.PromptLengthBucketing {
		t.Errorf("profile b: %+v", got.PD)
	}
}

// Per-pod routing comes from each pod's own annotation.
func TestPodRouting(t *testing.T) {
	r := newResolver(t, DefaultGateway(), nil)
	prefill := ep("prefill", "m", profilesAnn)
	combined := ep("combined", "m", `{"profiles":{"default":{"routingConfig":{"combined":true,"promptLenBucketMinLength":2048}}}}`)
	bare := ep("bare", "m", "")
	cases := []struct {
		e       *pool.Endpoint
		profile string
		want    RoutingConfig
	}{
		{prefill, "chat", RoutingConfig{PromptLenBucketMaxLength: 2048, PrefillScorePolicy: "least_request"}},
		{prefill, "batch", RoutingConfig{}},
		{prefill, "nope", RoutingConfig{PromptLenBucketMaxLength: 2048, PrefillScorePolicy: "least_request"}}, // pod's default profile
		{combined, "chat", RoutingConfig{Combined: true, PromptLenBucketMinLength: 2048}},                     // falls back to "default"
		{bare, "chat", RoutingConfig{}},
	}
	for _, c := range cases {
		got := r.PodRouting(c.e, c.profile)
		got.PD = nil
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s/%s: got %+v, want %+v", c.e.Name, c.profile, got, c.want)
		}
	}
	if !r.PodRouting(bare, "x").Covers(1<<20) || r.PodRouting(combined, "").Covers(100) || !r.PodRouting(combined, "").Covers(4096) {
		t.Error("Covers on pod routing")
	}
}

// A pod whose annotation turns bad keeps its last good config; one that never had a good one
// gets the defaults. Each problem is reported once per pod and value.
func TestLastGoodAnnotation(t *testing.T) {
	rec := &recorder{}
	r := newResolver(t, DefaultGateway(), rec)
	good := `{"lockedRoutingStrategy":"pd","profiles":{"default":{"routingConfig":{"promptLenBucketMaxLength":100}}}}`
	bad := `{"lockedRoutingStrategy":"pd",`

	v1 := ep("a", "m", good)
	if got, _ := r.ResolveEndpoints(nil, []*pool.Endpoint{v1}); got.Strategy != "pd" {
		t.Fatalf("good: %s", got)
	}
	// The pod is republished with a broken annotation (a new Endpoint, as sources do).
	v2 := ep("a", "m", bad)
	got, err := r.ResolveEndpoints(map[string]string{wire.HeaderRoutingStrategy: "random"}, []*pool.Endpoint{v2})
	if err != nil || got.Strategy != "pd" || got.StrategySource != SourceLocked || r.PodRouting(v2, "").PromptLenBucketMaxLength != 100 {
		t.Errorf("bad annotation must keep the last good config: %s %v", got, err)
	}
	reps := rec.take()
	if len(reps) != 1 || !strings.HasPrefix(reps[0], "ns/a model.aibrix.ai/config | model.aibrix.ai/config: must be a JSON object: ") ||
		!strings.HasSuffix(reps[0], "; the pod's last good config stays in use") {
		t.Errorf("reports %v", reps)
	}
	// The same bad value again (another port, another snapshot): no new report.
	v3 := ep("a", "m", bad)
	r.ResolveEndpoints(nil, []*pool.Endpoint{v3})
	r.PodRouting(v3, "")
	if reps := rec.take(); len(reps) != 0 {
		t.Errorf("repeated report %v", reps)
	}
	// Fixed: the new value applies.
	v4 := ep("a", "m", `{"profiles":{"default":{"routingStrategy":"random"}}}`)
	if got, _ := r.ResolveEndpoints(nil, []*pool.Endpoint{v4}); got.Strategy != "random" || got.StrategySource != SourceProfile {
		t.Errorf("fixed annotation: %s", got)
	}
	// A new pod that never had a good annotation: defaults, and the report says so.
	n := ep("new", "m", `not json`)
	if got, _ := r.ResolveEndpoints(nil, []*pool.Endpoint{n}); got.StrategySource != SourceGateway || got.ConfigPod != "" {
		t.Errorf("new bad pod: %s", got)
	}
	if reps := rec.take(); len(reps) != 1 || !strings.HasSuffix(reps[0], "; the gateway defaults apply") {
		t.Errorf("reports %v", reps)
	}
	// The model-wide config skips a pod without a usable config and reads the next one.
	if got, _ := r.ResolveEndpoints(nil, []*pool.Endpoint{n, v4}); got.ConfigPod != "ns/a" || got.Strategy != "random" {
		t.Errorf("skip unusable: %s", got)
	}
	// A partly bad annotation applies its good fields and reports the bad ones, once.
	p := ep("p", "m", `{"profiles":{"default":{"routingStrategy":"pd","routingConfig":{"prefillScorePolicy":"magic"}}}}`)
	got, _ = r.ResolveEndpoints(nil, []*pool.Endpoint{p})
	if got.Strategy != "pd" || got.PrefillScorePolicy != "prefix_cache" {
		t.Errorf("partial: %s %s", got, got.PrefillScorePolicy)
	}
	if reps := rec.take(); len(reps) != 1 || reps[0] != `ns/p profiles.default.routingConfig.prefillScorePolicy | profiles.default.routingConfig.prefillScorePolicy="magic": `+prefillPolicyRule {
		t.Errorf("reports %v", reps)
	}
}

// Each distinct annotation value is parsed once and shared by every pod carrying it.
func TestAnnotationMemoisedByValue(t *testing.T) {
	r := newResolver(t, DefaultGateway(), nil)
	p := r.Profiles()
	a, b := ep("a", "m", profilesAnn), ep("b", "m", profilesAnn)
	if va, vb := p.view(a), p.view(b); va == nil || va != vb {
		t.Errorf("views %p %p: want one shared view", va, vb)
	}
	if len(p.values) != 1 {
		t.Errorf("%d values cached, want 1", len(p.values))
	}
}

func TestResolveModelAndPruning(t *testing.T) {
	r := newResolver(t, DefaultGateway(), nil)
	store := pool.NewStore()
	a1 := ep("a1", "alpha", "")
	a2 := ep("a2", "alpha", `{"profiles":{"default":{"routingStrategy":"pd"}}}`)
	b1 := ep("b1", "beta", `{"profiles":{"default":{"routingStrategy":"random"}}}`)
	snap := store.Publish(pool.Info{}, []*pool.Endpoint{b1, a2, a1}, true)
	cases := []struct{ model, strategy, pod string }{
		{"alpha", "pd", "ns/a2"},
		{"beta", "random", "ns/b1"},
		{"gamma", "pd", "ns/a2"}, // no endpoint labelled gamma: the first config in the pool (sorted: a1, a2, b1)
	}
	for _, c := range cases {
		got, err := r.Resolve(nil, c.model, snap)
		if err != nil || got.Strategy != c.strategy || got.ConfigPod != c.pod {
			t.Errorf("%s: %s %v", c.model, got, err)
		}
	}
	// A model whose pods carry no config does not borrow another model's.
	c1 := ep("c1", "gamma", "")
	snap2 := store.Publish(pool.Info{}, []*pool.Endpoint{a2, c1}, true)
	if got, _ := r.Resolve(nil, "gamma", snap2); got.ConfigPod != "" || got.StrategySource != SourceGateway {
		t.Errorf("gamma: %s", got)
	}
	// The newer snapshot pruned the pods that left.
	p := r.Profiles()
	p.mu.Lock()
	_, hasB := p.pods["ns/b1"]
	nvalues := len(p.values)
	p.mu.Unlock()
	if hasB || nvalues != 1 {
		t.Errorf("after pruning: b1 kept=%v, %d values", hasB, nvalues)
	}
	if _, ok := p.byEndpoint.Load(b1); ok {
		t.Error("endpoint b1 still cached")
	}
	// An older snapshot still resolves (throwaway index) without undoing the pruning.
	if got, _ := r.Resolve(nil, "beta", snap); got.Strategy != "random" {
		t.Errorf("old snapshot: %s", got)
	}
	if idx := r.index.Load(); idx.snap != snap2 {
		t.Error("an older snapshot replaced the index")
	}
}

// Concurrent resolution while snapshots change (run with -race).
func TestConcurrentResolve(t *testing.T) {
	rec := &recorder{}
	r := newResolver(t, DefaultGateway(), rec)
	store := pool.NewStore()
	build := func(gen int) []*pool.Endpoint {
		var eps []*pool.Endpoint
		for i := range 16 {
			ann := fmt.Sprintf(`{"profiles":{"default":{"routingConfig":{"promptLenBucketMaxLength":%d}}}}`, 100+gen%3)
			if i == 3 {
				ann = `{"profiles":` // always bad
			}
			eps = append(eps, ep(fmt.Sprintf("pod-%02d", i), "m", ann))
		}
		return eps
	}
	store.Publish(pool.Info{}, build(0), true)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				snap := store.Load()
				res, err := r.Resolve(map[string]string{wire.HeaderConfigProfile: "default"}, "m", snap)
				if err != nil {
					t.Error(err)
					return
				}
				for _, e := range snap.Endpoints {
					if rc := r.PodRouting(e, res.ProfileName); e.Name != "pod-03" && rc.PromptLenBucketMaxLength < 100 {
						t.Errorf("%s: %+v", e.Name, rc)
						return
					}
				}
			}
		}()
	}
	for gen := 1; gen <= 50; gen++ {
		store.Publish(pool.Info{}, build(gen), true)
	}
	close(stop)
	wg.Wait()
	for _, rep := range rec.take() {
		if !strings.HasPrefix(rep, "ns/pod-03 ") {
			t.Errorf("unexpected report %s", rep)
		}
	}
}

func benchPool(n int) (*pool.Snapshot, []*pool.Endpoint) {
	var eps []*pool.Endpoint
	for i := range n {
		role := "prefill"
		if i%2 == 1 {
			role = "decode"
		}
		ann := fmt.Sprintf(`{"lockedRoutingStrategy":"pd","profiles":{"default":{"routingStrategy":"pd","routingConfig":{"promptLenBucketMaxLength":%d}}}}`, 2048*(1+i%4))
		e := pool.NewEndpoint("ns", fmt.Sprintf("pod-%04d", i), fmt.Sprintf("10.0.%d.%d", i/256, i%256), 8000, 0,
			map[string]string{pool.LabelModelName: "m", pool.LabelRoleName: role, pool.LabelRolesetName: fmt.Sprint(i / 2)},
			map[string]string{pool.AnnotationConfig: ann})
		eps = append(eps, e)
	}
	return pool.NewStore().Publish(pool.Info{}, eps, true), eps
}

// BenchmarkPerRequest128 is what the picker pays per request on 128 endpoints: one
// ResolveModel and one PodRouting per endpoint.
func BenchmarkPerRequest128(b *testing.B) {
	r := newResolver(b, DefaultGateway(), nil)
	snap, eps := benchPool(128)
	headers := map[string]string{wire.HeaderConfigProfile: "default"}
	r.Resolve(headers, "m", snap)
	b.ReportAllocs()
	for b.Loop() {
		res, _ := r.Resolve(headers, "m", snap)
		for _, e := range eps {
			_ = r.PodRouting(e, res.ProfileName)
		}
	}
}

func BenchmarkResolveModel(b *testing.B) {
	r := newResolver(b, DefaultGateway(), nil)
	snap, _ := benchPool(128)
	headers := map[string]string{wire.HeaderConfigProfile: "default", wire.HeaderRoutingStrategy: "random"}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = r.Resolve(headers, "m", snap)
	}
}
