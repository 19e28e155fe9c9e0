package picker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

func ep(name, role, annotation string) *pool.Endpoint {
	labels := map[string]string{pool.LabelModelName: "m"}
	if role != "" {
		labels[pool.LabelRoleName] = role
	}
	ann := map[string]string{}
	if annotation != "" {
		ann[pool.AnnotationConfig] = annotation
	}
	return pool.NewEndpoint("ns", name, "10.0.0."+fmt.Sprint(len(name)+int(name[len(name)-1])%200), 8000, 0, labels, ann)
}

func snapOf(eps ...*pool.Endpoint) *pool.Snapshot {
	return pool.NewStore().Publish(pool.Info{}, eps, true)
}

func parse(t *testing.T, headers map[string]string, prompt string) *request.Request {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt})
	r, err := request.Parse("POST", "/v1/completions", headers, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newResolver(t *testing.T, def string) *config.Resolver {
	t.Helper()
	gw := config.DefaultGateway()
	gw.DefaultStrategy = def
	r, err := config.NewResolver(gw, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Strategy precedence, end to end through the Router: lockedRoutingStrategy > header >
// profile > gateway default; the strategy used is echoed.
func TestStrategyPrecedence(t *testing.T) {
	const locked = `{"lockedRoutingStrategy": "random", "profiles": {"default": {"routingStrategy": "prefix-cache"}}}`
	const profiles = `{"defaultProfile": "p1", "profiles": {"p1": {"routingStrategy": "prefix-cache"}, "p2": {"routingStrategy": "random"}}}`
	cases := []struct {
		name, annotation string
		headers          map[string]string
		strategy         string
	}{
		{"gateway default", "", nil, "least-request"},
		{"header", "", map[string]string{"routing-strategy": "random"}, "random"},
		{"profile", profiles, nil, "prefix-cache"},
		{"config-profile header picks p2", profiles, map[string]string{"config-profile": "p2"}, "random"},
		{"header beats profile", profiles, map[string]string{"routing-strategy": "least-request"}, "least-request"},
		{"locked beats header", locked, map[string]string{"routing-strategy": "least-request"}, "random"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(t, NewDeps(nil, config.PrefixCache{}), "least-request")
			snap := snapOf(ep("a", "", tc.annotation))
			d, err := r.Schedule(context.Background(), parse(t, tc.headers, "hi"), snap, snap.Endpoints)
			if err != nil || d.Strategy != tc.strategy || d.ResponseHeaders["routing-strategy"] != tc.strategy {
				t.Fatalf("%+v %v", d, err)
			}
			d.Lifecycle.Done(nil)
		})
	}
}

func newTestRouter(t *testing.T, deps *Deps, def string) *Router {
	t.Helper()
	r, err := NewRouter(RouterOptions{Resolver: newResolver(t, def),
		Strategies: []Strategy{NewRandom(deps), NewLeastRequestStrategy(deps), NewPrefixCache(deps, config.DefaultPD())}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestUnknownStrategyIs400ListingValidOnes(t *testing.T) {
	r := newTestRouter(t, NewDeps(nil, config.PrefixCache{}), "")
	snap := snapOf(ep("a", "", ""))
	_, err := r.Schedule(context.Background(), parse(t, map[string]string{"routing-strategy": "fastest"}, "hi"), snap, snap.Endpoints)
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != "routing-strategy" {
		t.Fatalf("header: %v", err)
	}
	// A strategy the configuration allows but this router does not run (pd is not
	// registered here) is a 400 listing the ones it runs.
	snap = snapOf(ep("a", "", `{"lockedRoutingStrategy": "pd"}`))
	_, err = r.Schedule(context.Background(), parse(t, nil, "hi"), snap, snap.Endpoints)
	if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Message, "least-request, prefix-cache, random") {
		t.Fatalf("locked: %v", err)
	}
}

// Non-PD strategies never send a request to a prefill-only pod, echo their name, and
// least-request picks the emptiest endpoint.
func TestNonPDStrategies(t *testing.T) {
	deps := NewDeps(nil, config.PrefixCache{})
	r := newTestRouter(t, deps, "")
	a, b, p := ep("a", "", ""), ep("b", "decode", ""), ep("p", "prefill", "")
	snap := snapOf(a, b, p)
	deps.Running.Start(a.Key())
	for _, s := range []string{"random", "least-request", "prefix-cache"} {
		for range 30 {
			d, err := r.Schedule(context.Background(), parse(t, map[string]string{"routing-strategy": s}, "hello"), snap, snap.Endpoints)
			if err != nil {
				t.Fatal(err)
			}
			if d.ResponseHeaders["routing-strategy"] != s || d.Strategy != s {
				t.Fatalf("echo %v", d.ResponseHeaders)
			}
			for _, e := range d.Destination {
				if e.Role == pool.RolePrefill {
					t.Fatalf("%s sent a request to a prefill pod", s)
				}
			}
			if s == "least-request" && d.Destination[0] != b {
				t.Fatalf("least-request chose %s with 1 in flight", d.Destination[0].Name)
			}
			d.Lifecycle.Done(nil)
		}
	}
}

// prefix-cache: the pod that served a prompt gets the next one sharing its prefix.
func TestPrefixCacheStrategyFollowsThePrefix(t *testing.T) {
	deps := NewDeps(nil, config.PrefixCache{})
	r := newTestRouter(t, deps, "prefix-cache")
	eps := []*pool.Endpoint{ep("a", "", ""), ep("b", "", ""), ep("c", "", ""), ep("d", "", "")}
	snap := snapOf(eps...)
	text := strings.Repeat("a long shared system prompt. ", 100)
	d, err := r.Schedule(context.Background(), parse(t, nil, text+"q1"), snap, snap.Endpoints)
	if err != nil {
		t.Fatal(err)
	}
	d.Lifecycle.Done(nil)
	for range 10 {
		d2, err := r.Schedule(context.Background(), parse(t, nil, text+"q2"), snap, snap.Endpoints)
		if err != nil || d2.Destination[0] != d.Destination[0] {
			t.Fatalf("followed %v, want %s", d2.Destination, d.Destination[0].Name)
		}
		d2.Lifecycle.Done(nil)
	}
}

func TestRouterDefaultsToPDWhenRolesPresent(t *testing.T) {
	deps := NewDeps(nil, config.PrefixCache{})
	r := newTestRouter(t, deps, "")
	snap := snapOf(ep("p", "prefill", ""), ep("d", "decode", ""))
	_, err := r.Schedule(context.Background(), parse(t, nil, "x"), snap, snap.Endpoints)
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Reason != "unknown_strategy" || !strings.Contains(ae.Message, `"pd"`) {
		t.Fatalf("without a pd strategy registered: %v", err)
	}
}

func TestRegistry(t *testing.T) {
	reg := NewRegistry()
	deps := NewDeps(nil, config.PrefixCache{})
	if _, err := reg.New("nope", "", nil, deps); err == nil || !strings.Contains(err.Error(), TypeMaxScorePicker) {
		t.Fatalf("%v", err)
	}
	if _, err := reg.New(TypeMaxScorePicker, "", json.RawMessage(`{"maxFallbacks": -1}`), deps); err == nil ||
		!strings.Contains(err.Error(), "maxFallbacks=-1") {
		t.Fatalf("%v", err)
	}
	p, err := reg.New(TypePrefixCacheScorer, "pc", json.RawMessage(`{"blockSize": 16, "minMatchPct": 30}`), deps)
	if err != nil || p.Name() != "pc" || p.Type() != TypePrefixCacheScorer || p.(*PrefixCacheScorer).BlockTokens != 16 {
		t.Fatalf("%v %v", p, err)
	}
	// A chain assembled from registry plugins runs.
	sc, _ := reg.New(TypeLeastRequestScorer, "", nil, deps)
	pk, _ := reg.New(TypeMaxScorePicker, "", json.RawMessage(`{"maxFallbacks": 0}`), deps)
	hd, _ := reg.New(TypeSingleProfileHandler, "", nil, deps)
	ch := &Chain{StrategyName: "custom", Handler: hd.(ProfileHandler), Deps: deps,
		Profiles: []*Profile{{Name: "only", Scorers: []WeightedScorer{{sc.(Scorer), 1}}, Picker: pk.(Picker)}}}
	snap := snapOf(ep("a", "", ""), ep("b", "", ""))
	d, err := ch.Pick(context.Background(), &Cycle{Req: parse(t, nil, "x"), Snap: snap, Candidates: snap.Endpoints, State: &CycleState{}})
	if err != nil || len(d.Destination) != 1 {
		t.Fatalf("%v %v", d, err)
	}
	d.Lifecycle.Done(nil)
}
