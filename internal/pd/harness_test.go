package pd

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
	"github.com/tandem-epp/tandem/internal/request"
)

// pod describes a test pod: name "pA" with role "prefill" in roleset "A", and optionally
// a routingConfig (JSON) for its default profile.
type pod struct {
	name, role, roleset string
	routing             string
	labels              map[string]string
}

func P(name, rs string) pod { return pod{name: name, role: "prefill", roleset: rs} }
func D(name, rs string) pod { return pod{name: name, role: "decode", roleset: rs} }

// C is a standard pod with combined: true and the given extra routingConfig fields.
func C(name, extra string) pod {
	rc := `"combined": true`
	if extra != "" {
		rc += ", " + extra
	}
	return pod{name: name, routing: "{" + rc + "}"}
}

func (p pod) rng(lo, hi int) pod {
	p.routing = fmt.Sprintf(`{"promptLenBucketMinLength": %d, "promptLenBucketMaxLength": %d}`, lo, hi)
	return p
}

type harness struct {
	t      *testing.T
	clock  *load.ManualClock
	deps   *picker.Deps
	c      *Cascade
	router *picker.Router
	store  *pool.Store
	gw     config.PD
	byName map[string]*pool.Endpoint
	// match are the pair-match labels publish builds endpoints with (nil: none).
	match pool.PairMatch
	// addrs: each pod's address, kept across publishes (a pod that stays is the same pod).
	addrs map[string]string
	// forgot receives the test of every forgetting pass (picker.Deps.OnForget).
	forgot chan func(string) bool
}

func newHarness(t *testing.T, gw config.PD, pods ...pod) *harness {
	t.Helper()
	return newHarnessNames(t, gw, config.Names{}, pods...)
}

// newHarnessNames is newHarness with the policy names the configuration accepts.
func newHarnessNames(t *testing.T, gw config.PD, names config.Names, pods ...pod) *harness {
	t.Helper()
	clock := load.NewManualClock(time.Unix(1_700_000_000, 0))
	deps := picker.NewDeps(clock, gw.PrefixCache)
	h := &harness{t: t, clock: clock, deps: deps, gw: gw, store: pool.NewStore()}
	h.c = New(Options{Deps: deps, Gateway: gw})
	res, err := config.NewResolver(config.Gateway{PD: gw, DefaultStrategy: StrategyName}, config.Options{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	r, err := picker.NewRouter(picker.RouterOptions{Resolver: res, Strategies: Strategies(h.c, deps, gw)})
	if err != nil {
		t.Fatal(err)
	}
	h.router = r
	h.publish(pods...)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.forgot = make(chan func(string) bool, 64)
	deps.OnForget(func(live func(string) bool) {
		select {
		case h.forgot <- live:
		default: // a test that does not wait for forgetting
		}
	})
	go deps.RetireDeparted(h.store)(ctx)
	return h
}

// departed publishes pods and waits until the state of the endpoints that left is forgotten
// (picker.Deps.RetireDeparted, as the application runs it).
func (h *harness) departed(pods ...pod) {
	h.t.Helper()
	before := h.byName
	h.publish(pods...)
	var left []string
	for name, e := range before {
		if h.byName[name] == nil {
			left = append(left, e.Key())
		}
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case live := <-h.forgot:
			if !slices.ContainsFunc(left, live) {
				return // a pass over this pool: none of those that left is live
			}
		case <-timeout:
			h.t.Fatalf("%v were not forgotten within 10 s", left)
		}
	}
}

func (h *harness) publish(pods ...pod) {
	h.byName = map[string]*pool.Endpoint{}
	eps := make([]*pool.Endpoint, 0, len(pods))
	for _, p := range pods {
		labels := map[string]string{pool.LabelModelName: "m"}
		if p.role != "" {
			labels[pool.LabelRoleName] = p.role
		}
		if p.roleset != "" {
			labels[pool.LabelRolesetName] = p.roleset
		}
		for k, v := range p.labels {
			labels[k] = v
		}
		ann := map[string]string{}
		if p.routing != "" {
			ann[pool.AnnotationConfig] = `{"profiles": {"default": {"routingConfig": ` + p.routing + `}}}`
		}
		e := h.match.NewEndpoint("ns", p.name, h.addressOf(p.name), 8000, 0, labels, ann)
		h.byName[p.name] = e
		eps = append(eps, e)
	}
	h.store.Publish(pool.Info{Name: "pool"}, eps, true)
}

// addressOf is the pod's address: the next free one the first time it is published.
func (h *harness) addressOf(name string) string {
	if h.addrs == nil {
		h.addrs = map[string]string{}
	}
	a, ok := h.addrs[name]
	if !ok {
		n := len(h.addrs)
		a = fmt.Sprintf("10.0.%d.%d", n/250, n%250+1)
		h.addrs[name] = a
	}
	return a
}

func (h *harness) key(name string) string {
	h.t.Helper()
	e, ok := h.byName[name]
	if !ok {
		h.t.Fatalf("no pod %q", name)
	}
	return e.Key()
}

// prompt returns a completions body whose prompt is n tokens (4n bytes) of text seeded by s.
func prompt(s string, n int) string {
	var b strings.Builder
	for b.Len() < 4*n {
		b.WriteString(s)
	}
	return b.String()[:4*n]
}

func (h *harness) pick(text string, headers map[string]string) (*picker.Decision, error) {
	h.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": text})
	hd := map[string]string{}
	for k, v := range headers {
		hd[k] = v
	}
	req, err := request.Parse("POST", "/v1/completions", hd, body)
	if err != nil {
		h.t.Fatal(err)
	}
	snap := h.store.Load()
	return h.router.Schedule(context.Background(), req, snap, snap.Endpoints)
}

func (h *harness) mustPick(text string) *picker.Decision {
	h.t.Helper()
	d, err := h.pick(text, nil)
	if err != nil {
		h.t.Fatalf("pick: %v", err)
	}
	return d
}

// Load setters. Each leaves its counters held for the rest of the test.
func (h *harness) prefillInFlight(name string, n int) {
	for range n {
		h.c.prefill.Start(h.key(name))
	}
}

func (h *harness) running(name string, n int) {
	k := h.key(name)
	h.deps.Running.Start(k)() // the gateway has now seen the pod: it "has the metric"
	for range n {
		h.deps.Running.Start(k)
	}
}

func (h *harness) pendingDecode(name string, n int) {
	for range n {
		h.c.pending.Start(h.key(name))
	}
}

// completions records n completions in the last minute: drain rate n/60 per second.
func (h *harness) completions(name string, n int) {
	for range n {
		h.deps.Drain.Record(h.key(name))
	}
}

func (h *harness) sample(name string, s metrics.Sample) {
	h.deps.Metrics.Put(h.key(name), &s)
}

// warm makes pod hold the first blocks of text (blocks of the gateway block size, in the PD
// policies' layout).
func (h *harness) warm(name, text string, blocks int) {
	hs, _ := prefix.HashHead(nil, text, prefix.BlockBytes(h.gw.PrefixCache.BlockSize), prefix.HeadSplit(h.gw.PrefixCache.BlockSize))
	h.deps.Prefix.Add("m", hs[:blocks], h.key(name))
}

func names(eps []*pool.Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name
	}
	return out
}

func first(eps []*pool.Endpoint) string {
	if len(eps) == 0 {
		return ""
	}
	return eps[0].Name
}

func gateway(mut func(*config.PD)) config.PD {
	gw := config.DefaultPD()
	gw.PrefixCache.BlockSize = 4 // 16-byte blocks: short test prompts still hash
	if mut != nil {
		mut(&gw)
	}
	return gw
}
