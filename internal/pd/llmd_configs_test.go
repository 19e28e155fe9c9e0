package pd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// loadedConfig is a picker assembled as cmd/epp assembles it, from one config file of
// testdata, with the prefix warmer running.
type loadedConfig struct {
	t   *testing.T
	p   *app.Picker
	eps []*pool.Endpoint
	s   *pool.Snapshot
}

func loadConfig(t *testing.T, file string, eps ...*pool.Endpoint) *loadedConfig {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	f, err := config.ParseFile(file, data, config.FileOptions{KnownPluginTypes: pd.IsPluginType})
	if err != nil {
		t.Fatalf("%s does not load: %v", file, err)
	}
	gw, _, err := config.Load(f, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	p, err := app.BuildPicker(app.PickerOptions{Gateway: gw, File: f, Logger: logr.Discard()})
	if err != nil {
		t.Fatalf("%s does not build: %v", file, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go p.Deps.Warmer.Run(ctx)
	return &loadedConfig{t: t, p: p, eps: eps, s: pool.NewStore().Publish(pool.Info{Name: "pool"}, eps, true)}
}

func (l *loadedConfig) route(tokens int, seed string) *picker.Decision {
	l.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": llmdPrompt(seed, tokens)})
	r, err := request.Parse("POST", "/v1/completions", map[string]string{}, body)
	if err != nil {
		l.t.Fatal(err)
	}
	d, err := l.p.Router.Schedule(context.Background(), r, l.s, l.s.Endpoints)
	if err != nil {
		l.t.Fatalf("route: %v", err)
	}
	// The request completes; its warms land before the next request routes.
	d.Lifecycle.ResponseHeaders(200, nil)
	d.Lifecycle.Done(nil)
	if err := l.p.Deps.Warmer.Flush(context.Background()); err != nil {
		l.t.Fatal(err)
	}
	return d
}

func llmdPrompt(seed string, tokens int) string {
	var b strings.Builder
	for b.Len() < 4*tokens {
		fmt.Fprintf(&b, "%s %d. ", seed, b.Len())
	}
	return b.String()[:4*tokens]
}

// llmdPool is an llm-d pool: pods labelled llm-d.ai/role, no rolesets.
func llmdPool() []*pool.Endpoint {
	var eps []*pool.Endpoint
	for i, role := range []string{"prefill", "prefill", "decode", "decode"} {
		eps = append(eps, pool.NewEndpoint("ns", fmt.Sprintf("%s-%d", role, i), fmt.Sprintf("10.2.0.%d", i+1), 8000, 0,
			map[string]string{pool.LabelLLMDRole: role, pool.LabelModelName: "m"}, nil))
	}
	return eps
}

// llm-d-router v0.10.0's PD configs load unchanged and route as llm-d routes them: an
// uncached prompt goes to a decode pod with a prefill pod in x-prefiller-host-port (the
// prefix-based decider: 384 uncached tokens ≥ nonCachedTokens 16); the same prompt again
// finds its prefix on that decode pod (the producer warmed it; the prefix scorer, weight 2,
// sends it back there), leaves 0 uncached tokens and is decoded there alone; a prompt
// shorter than 16 tokens is never disaggregated.
func TestLLMDPDConfigsRouteAsLLMD(t *testing.T) {
	for _, file := range []string{"llm-d-router-v0.10.0/pd-epp-config.yaml", "llm-d-router-v0.10.0/sim-pd-epp-config.yaml"} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			l := loadConfig(t, file, llmdPool()...)
			if got := l.p.Router.Default(); got != pd.TypeDisaggHandler {
				t.Fatalf("the file's scheduling is strategy %q, want %q (the handler's name)", got, pd.TypeDisaggHandler)
			}
			// 384 tokens: 6 whole blocks of 64 tokens (llm-d's minimum block size).
			d := l.route(384, "system prompt")
			if d.Strategy != pd.TypeDisaggHandler || d.Outcome != picker.OutcomePD || d.Step != pd.StepPrefillDecode {
				t.Fatalf("uncached prompt: strategy %s outcome %s step %s", d.Strategy, d.Outcome, d.Step)
			}
			dst, pre := d.Destination[0], d.Prefill[0]
			if dst.Labels[pool.LabelLLMDRole] != "decode" || pre.Labels[pool.LabelLLMDRole] != "prefill" ||
				d.SetHeaders[wire.HeaderPrefillerHostPort] != pre.HostPort() {
				t.Fatalf("destination %s, prefill %s, header %q", dst.Name, pre.Name, d.SetHeaders[wire.HeaderPrefillerHostPort])
			}
			again := l.route(384, "system prompt")
			if again.Destination[0] != dst || again.Outcome != picker.OutcomeSingle || again.Step != pd.StepDecodeOnly || len(again.Prefill) != 0 {
				t.Fatalf("cached prompt: destination %s (first %s), outcome %s, step %s, prefill %d",
					again.Destination[0].Name, dst.Name, again.Outcome, again.Step, len(again.Prefill))
			}
			short := l.route(10, "hi")
			if short.Outcome != picker.OutcomeSingle || short.Destination[0].Labels[pool.LabelLLMDRole] != "decode" {
				t.Fatalf("short prompt: outcome %s to %s", short.Outcome, short.Destination[0].Name)
			}
		})
	}
}

// The non-PD configs route every request to a decode pod, never naming a prefill target.
func TestLLMDNonPDConfigsRouteToDecodePods(t *testing.T) {
	for _, file := range []string{"llm-d-router-v0.10.0/epp-config.yaml", "llm-d-router-v0.10.0/sim-epp-config.yaml"} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			l := loadConfig(t, file, llmdPool()...)
			if got := l.p.Router.Default(); got != config.DefaultProfileName {
				t.Fatalf("default strategy %q, want the file's profile %q", got, config.DefaultProfileName)
			}
			for i := range 20 {
				d := l.route(50+i*40, fmt.Sprintf("prompt %d", i%3))
				if len(d.Prefill) != 0 || d.SetHeaders[wire.HeaderPrefillerHostPort] != "" || d.Strategy != config.DefaultProfileName {
					t.Fatalf("request %d: prefill %v, strategy %s", i, d.Prefill, d.Strategy)
				}
				for _, e := range d.Destination {
					if e.Labels[pool.LabelLLMDRole] != "decode" {
						t.Fatalf("request %d went to %s", i, e.Name)
					}
				}
			}
		})
	}
}

// GIE v1.3.1's default config loads and routes by its weighted scorers: queue (2), KV cache
// (2) and prefix (3). Worked by hand for a cold prompt (prefix 0 everywhere): pod a waits
// 0 with 20% KV used → 2·1 + 2·0.8 = 3.6; b waits 4 with 10% → 2·0 + 2·0.9 = 1.8; c waits 2
// with 0% → 2·0.5 + 2·1 = 3. The same prompt again holds its prefix on a (+3): a stays first.
func TestGIEDefaultConfigRoutesByItsScorers(t *testing.T) {
	var eps []*pool.Endpoint
	for i, n := range []string{"a", "b", "c"} {
		eps = append(eps, pool.NewEndpoint("ns", n, fmt.Sprintf("10.3.0.%d", i+1), 8000, 0, map[string]string{pool.LabelModelName: "m"}, nil))
	}
	l := loadConfig(t, "gie-v1.3.1/default-plugins.yaml", eps...)
	for e, s := range map[*pool.Endpoint]metrics.Sample{
		eps[0]: {Waiting: 0, HasWaiting: true, KVUsage: 0.2, HasKVUsage: true},
		eps[1]: {Waiting: 4, HasWaiting: true, KVUsage: 0.1, HasKVUsage: true},
		eps[2]: {Waiting: 2, HasWaiting: true, KVUsage: 0, HasKVUsage: true},
	} {
		l.p.Deps.Metrics.Put(e.Key(), &s)
	}
	for range 3 {
		d := l.route(700, "gie")
		if names := []string{d.Destination[0].Name, d.Destination[1].Name, d.Destination[2].Name}; strings.Join(names, ",") != "a,c,b" {
			t.Fatalf("ranking %v, want a,c,b (trace %+v)", names, d.Trace)
		}
	}
}
