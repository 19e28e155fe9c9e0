package pd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
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
)

// seedChainFile declares, plugin by plugin, the chain the built-in pd strategy runs.
const seedChainFile = `
plugins:
- {type: pd-role-filter, name: prefill-pods, parameters: {role: prefill}}
- {type: pd-role-filter, name: decode-pods, parameters: {role: decode}}
- {type: pd-role-filter, name: combined-pods, parameters: {role: combined}}
- type: prompt-length-bucket-filter
- type: prefill-stddev-filter
- type: prefill-policy-scorer
- type: decode-policy-scorer
- type: combined-overflow-decider
- type: prefill-imbalance-decider
- type: decode-imbalance-decider
- type: roleset-pd-profile-handler
  name: seed
  parameters:
    deciders: {combinedOverflow: combined-overflow-decider, prefillImbalance: prefill-imbalance-decider, decodeImbalance: decode-imbalance-decider}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-pods}, {pluginRef: prompt-length-bucket-filter}, {pluginRef: prefill-stddev-filter}, {pluginRef: prefill-policy-scorer}]
- name: decode
  plugins: [{pluginRef: decode-pods}, {pluginRef: prompt-length-bucket-filter}, {pluginRef: decode-policy-scorer}]
- name: combined
  plugins: [{pluginRef: combined-pods}, {pluginRef: prompt-length-bucket-filter}]
`

func buildFrom(t *testing.T, yaml string, gw config.Gateway) *app.Picker {
	t.Helper()
	var f *config.File
	if yaml != "" {
		var err error
		if f, err = config.ParseFile("epp.yaml", []byte(yaml), config.FileOptions{KnownPluginTypes: pd.IsPluginType}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := app.BuildPicker(app.PickerOptions{Gateway: gw, File: f, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A config file composing the seed's cascade from its plugins is the built-in pd strategy:
// with the same random source and the same load, both decide alike, pick after pick.
func TestComposedSeedChainIsThePDStrategy(t *testing.T) {
	gw := config.DefaultGateway()
	gw.PD.PrefixCache.BlockSize = 4
	gw.PD.PrefillLoadImbalanceMinSpread = 2
	gw.PD.DecodeLoadImbalanceMinSpread = 3
	builtin, composed := buildFrom(t, "", gw), buildFrom(t, seedChainFile, gw)
	if composed.Router.Default() != "seed" {
		t.Fatalf("the file's strategy is %q", composed.Router.Default())
	}
	for _, p := range []*app.Picker{builtin, composed} {
		rng := rand.New(rand.NewPCG(5, 5))
		p.Deps.Rand = func(n int) int { return rng.IntN(n) }
	}
	var eps []*pool.Endpoint
	for r := range 4 {
		for i, role := range []string{"prefill", "prefill", "decode", "decode"} {
			eps = append(eps, pool.NewEndpoint("ns", fmt.Sprintf("%s-%d-%d", role, r, i), fmt.Sprintf("10.4.%d.%d", r, i+1), 8000, 0,
				map[string]string{pool.LabelRoleName: role, pool.LabelRolesetName: fmt.Sprint("rs", r), pool.LabelModelName: "m"}, nil))
		}
	}
	eps = append(eps, pool.NewEndpoint("ns", "std", "10.4.9.1", 8000, 0, map[string]string{pool.LabelModelName: "m"},
		map[string]string{pool.AnnotationConfig: `{"profiles": {"default": {"routingConfig": {"combined": true}}}}`}))
	snap := pool.NewStore().Publish(pool.Info{}, eps, true)
	for _, p := range []*app.Picker{builtin, composed} {
		for i, e := range eps {
			p.Deps.Metrics.Put(e.Key(), &metrics.Sample{GenThroughput: float64(100 * i), HasGenThroughput: true, KVUsage: 0.3, HasKVUsage: true})
		}
	}
	load := rand.New(rand.NewPCG(9, 9))
	var live [2][]*picker.Decision
	steps := map[string]int{}
	for step := range 300 {
		text := strings.Repeat(fmt.Sprintf("shared %d ", step%4), 10+load.IntN(40))
		var got [2]string
		for i, p := range []*app.Picker{builtin, composed} {
			body, _ := json.Marshal(map[string]any{"model": "m", "prompt": text})
			r, _ := request.Parse("POST", "/v1/completions", map[string]string{}, body)
			hd := map[string]string{}
			if i == 0 {
				hd["routing-strategy"] = pd.StrategyName
			}
			r.Headers = hd
			d, err := p.Router.Schedule(context.Background(), r, snap, snap.Endpoints)
			if err != nil {
				t.Fatal(err)
			}
			live[i] = append(live[i], d)
			steps[d.Step]++
			got[i] = fmt.Sprint(d.Outcome, d.Step, names(d.Destination), names(d.Prefill), d.Trace.Scores)
		}
		if got[0] != got[1] {
			t.Fatalf("pick %d:\nbuilt-in %s\ncomposed %s", step, got[0], got[1])
		}
		if load.IntN(2) == 0 {
			j := load.IntN(len(live[0]))
			for i := range live {
				live[i][j].Lifecycle.ResponseHeaders(200, nil)
				live[i][j].Lifecycle.Done(nil)
				live[i] = append(live[i][:j], live[i][j+1:]...)
			}
		}
	}
	if steps[pd.StepPair] == 0 || steps[pd.StepPrefillImbalance]+steps[pd.StepDecodeRequests] == 0 {
		t.Fatalf("steps %v: the picks never scored a pair, or no fast path fired", steps)
	}
}

func names(eps []*pool.Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name
	}
	return out
}

// The roleset handler checks its profiles when the file is built.
func TestRolesetHandlerNeedsItsProfiles(t *testing.T) {
	cases := []struct{ name, yaml, want string }{
		{"no decode profile", `
plugins:
- type: prefill-policy-scorer
- type: roleset-pd-profile-handler
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-policy-scorer}]
`, `roleset-pd-profile-handler needs a scheduling profile named "decode" (profiles.decode)`},
		{"a scorer of the wrong side", `
plugins:
- type: prefill-policy-scorer
- type: roleset-pd-profile-handler
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-policy-scorer}]
- name: decode
  plugins: [{pluginRef: prefill-policy-scorer}]
`, `profile "decode": roleset-pd-profile-handler pairs on the raw cost of one decode-policy-scorer; "prefill-policy-scorer" is a prefill-policy-scorer`},
		{"a decider of the wrong kind", `
plugins:
- type: decode-imbalance-decider
- type: roleset-pd-profile-handler
  parameters: {deciders: {prefillImbalance: decode-imbalance-decider}}
`, `parameters.deciders.prefillImbalance=decode-imbalance-decider: names a decode-imbalance-decider, which is not that decider`},
		{"an unregistered policy", `
plugins:
- type: prefill-policy-scorer
  parameters: {policy: fastest}
`, `parameters.policy=fastest: must be a registered policy`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := config.ParseFile("epp.yaml", []byte(tc.yaml), config.FileOptions{KnownPluginTypes: pd.IsPluginType})
			if err == nil {
				_, err = app.BuildPicker(app.PickerOptions{Gateway: config.DefaultGateway(), File: f, Logger: logr.Discard()})
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n%v\nwant it to contain\n%s", err, tc.want)
			}
		})
	}
}

func buildPicker(f *config.File) (*app.Picker, error) {
	return app.BuildPicker(app.PickerOptions{Gateway: config.DefaultGateway(), File: f, Logger: logr.Discard()})
}

// A decode policy is named in any case in a config file, as in AIBRIX_DECODE_SCORE_POLICY; a
// prefill policy exactly, as AIBrix names it.
func TestPolicyScorerNamesDecodePoliciesInAnyCase(t *testing.T) {
	for yaml, ok := range map[string]bool{
		"plugins:\n- type: decode-policy-scorer\n  parameters: {policy: KV_Cache_Utilization}\n": true,
		"plugins:\n- type: decode-policy-scorer\n  parameters: {policy: ' Least_Request '}\n":    true,
		"plugins:\n- type: prefill-policy-scorer\n  parameters: {policy: Least_Request}\n":       false,
		"plugins:\n- type: decode-policy-scorer\n  parameters: {policy: '  '}\n":                 false,
	} {
		f, err := config.ParseFile("epp.yaml", []byte(yaml), config.FileOptions{KnownPluginTypes: pd.IsPluginType})
		if err == nil {
			_, err = buildPicker(f)
		}
		if (err == nil) != ok {
			t.Errorf("%q: error %v, want accepted %v", yaml, err, ok)
		}
	}
}
