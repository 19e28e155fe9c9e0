package pd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// predictiveChainFile declares, plugin by plugin, the chain the built-in pd-predictive
// strategy runs.
const predictiveChainFile = `
plugins:
- {type: pd-role-filter, name: prefill-pods, parameters: {role: prefill}}
- {type: pd-role-filter, name: decode-pods, parameters: {role: decode}}
- {type: pd-role-filter, name: combined-pods, parameters: {role: combined}}
- type: prompt-length-bucket-filter
- {type: prefill-policy-scorer, parameters: {policy: predicted_ttft}}
- {type: decode-policy-scorer, parameters: {policy: predicted_tpot}}
- type: selective-pd-decider
- type: slo-overflow-decider
- type: roleset-pd-profile-handler
  name: predictive
  parameters:
    deciders: {selective: selective-pd-decider, sloOverflow: slo-overflow-decider}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-pods}, {pluginRef: prompt-length-bucket-filter}, {pluginRef: prefill-policy-scorer}]
- name: decode
  plugins: [{pluginRef: decode-pods}, {pluginRef: prompt-length-bucket-filter}, {pluginRef: decode-policy-scorer}]
- name: combined
  plugins: [{pluginRef: combined-pods}, {pluginRef: prompt-length-bucket-filter}]
`

// predictivePool: 3 rolesets of 1 prefill + 1 decode pod and 2 standard pods; the model
// config (on the first standard pod) is annotation.
func predictivePool(annotation string) *pool.Snapshot {
	var eps []*pool.Endpoint
	for r := range 3 {
		for i, role := range []string{"prefill", "decode"} {
			eps = append(eps, pool.NewEndpoint("ns", fmt.Sprintf("%s-%d", role, r), fmt.Sprintf("10.5.%d.%d", r, i+1), 8000, 0,
				map[string]string{pool.LabelRoleName: role, pool.LabelRolesetName: fmt.Sprint("rs", r), pool.LabelModelName: "m"}, nil))
		}
	}
	for i := range 2 {
		eps = append(eps, pool.NewEndpoint("ns", fmt.Sprintf("std-%d", i), fmt.Sprintf("10.5.9.%d", i+1), 8000, 0, map[string]string{pool.LabelModelName: "m"},
			map[string]string{pool.AnnotationConfig: annotation}))
	}
	return pool.NewStore().Publish(pool.Info{}, eps, true)
}

const combinedProfile = `{"profiles": {"default": {"routingConfig": {"combined": true}}}}`

func completion(t *testing.T, prompt string, headers map[string]string) *request.Request {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 20})
	r, err := request.Parse("POST", "/v1/completions", map[string]string{}, body)
	if err != nil {
		t.Fatal(err)
	}
	if headers == nil {
		headers = map[string]string{}
	}
	r.Headers = headers
	return r
}

// A config file composing pd-predictive from its plugins is the built-in strategy: on the
// same clock, with the same events, both decide alike pick after pick, and they use every
// kind of placement.
func TestComposedPredictiveChainIsPDPredictive(t *testing.T) {
	clock := load.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	build := func(yaml string) *app.Picker {
		var f *config.File
		if yaml != "" {
			var err error
			if f, err = config.ParseFile("epp.yaml", []byte(yaml), config.FileOptions{KnownPluginTypes: pd.IsPluginType}); err != nil {
				t.Fatal(err)
			}
		}
		p, err := app.BuildPicker(app.PickerOptions{Clock: clock, Gateway: config.DefaultGateway(), File: f, Logger: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	builtin, composed := build(""), build(predictiveChainFile)
	if composed.Router.Default() != "predictive" {
		t.Fatalf("the file's strategy is %q", composed.Router.Default())
	}
	snap := predictivePool(combinedProfile)
	rng := rand.New(rand.NewPCG(4, 4))
	type inflight struct{ d [2]*picker.Decision }
	var live []inflight
	outcomes := map[picker.Outcome]int{}
	for step := range 400 {
		// Prompts of 40 to 40k bytes (10 to 10k tokens), several sharing a prefix.
		text := strings.Repeat(fmt.Sprintf("shared %d ", step%5), 1+rng.IntN(4000))
		var got [2]string
		var pair inflight
		for i, p := range []*app.Picker{builtin, composed} {
			hd := map[string]string{wire.HeaderSLOTTFT: "800", wire.HeaderSLOTPOT: "40"}
			if i == 0 {
				hd[wire.HeaderRoutingStrategy] = pd.StrategyPredictive
			}
			d, err := p.Router.Schedule(context.Background(), completion(t, text, hd), snap, snap.Endpoints)
			if err != nil {
				t.Fatal(err)
			}
			pair.d[i] = d
			got[i] = fmt.Sprint(d.Outcome, d.Step, names(d.Destination), names(d.Prefill), d.Trace.Scores)
		}
		if got[0] != got[1] {
			t.Fatalf("pick %d:\nbuilt-in %s\ncomposed %s", step, got[0], got[1])
		}
		outcomes[pair.d[0].Outcome]++
		live = append(live, pair)
		// Time passes; some requests finish: the prefill leg, the first byte, chunks, the end.
		clock.Advance(time.Duration(rng.IntN(40)) * time.Millisecond)
		if rng.IntN(3) > 0 && len(live) > 0 {
			j := rng.IntN(len(live))
			for _, d := range live[j].d {
				if po, ok := d.Lifecycle.(pd.PrefillObserver); ok && d.Outcome == picker.OutcomePD {
					po.PrefillDone(nil)
				}
				d.Lifecycle.ResponseHeaders(200, nil)
				for range 5 {
					d.Lifecycle.ResponseBody(16, false)
				}
				d.Lifecycle.Done(nil)
			}
			live = append(live[:j], live[j+1:]...)
		}
	}
	if outcomes[picker.OutcomePD] == 0 || outcomes[picker.OutcomeLocal] == 0 || outcomes[picker.OutcomeCombined] == 0 {
		t.Fatalf("outcomes %v: every kind of placement should occur", outcomes)
	}
}

// Through the router: the objectives come from the headers, else the profile, else the
// gateway; a malformed header is a 400 naming it; a sheddable request nothing can serve in
// time is a 429; every decision carries its prediction in the trace.
func TestPredictiveRouterAnswers(t *testing.T) {
	cases := []struct {
		name       string
		annotation string
		headers    map[string]string
		prompt     int // bytes
		status     int
		reason     string
	}{
		{"routed, prediction in the trace", combinedProfile, map[string]string{wire.HeaderSLOTTFT: "1000"}, 4000, 0, ""},
		{"bad ttft header", combinedProfile, map[string]string{wire.HeaderSLOTTFT: "fast"}, 40, http.StatusBadRequest, "bad_slo"},
		{"negative tpot header", combinedProfile, map[string]string{wire.HeaderSLOTPOT: "-5"}, 40, http.StatusBadRequest, "bad_slo"},
		// 10k tokens take ≈ 0.5 s on any pod (the cold-start models): a 300 ms objective is
		// out of reach. Sheddable (the profile says so): 429. Not sheddable: routed anyway.
		{"sheddable profile, out of reach", `{"profiles": {"default": {"routingConfig": {"combined": true, "sheddable": true}}}}`,
			map[string]string{wire.HeaderSLOTTFT: "300"}, 40000, http.StatusTooManyRequests, apierror.ReasonShed},
		{"not sheddable, out of reach", combinedProfile, map[string]string{wire.HeaderSLOTTFT: "300"}, 40000, 0, ""},
		// The profile's objective (sloTTFTMs) makes it out of reach without a header.
		{"profile objective, sheddable", `{"profiles": {"default": {"routingConfig": {"combined": true, "sheddable": true, "pd": {"sloTTFTMs": 300}}}}}`,
			nil, 40000, http.StatusTooManyRequests, apierror.ReasonShed},
		// The header wins over the profile: 2 s is within reach.
		{"header over profile", `{"profiles": {"default": {"routingConfig": {"combined": true, "sheddable": true, "pd": {"sloTTFTMs": 300}}}}}`,
			map[string]string{wire.HeaderSLOTTFT: "2000"}, 40000, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gw := config.DefaultGateway()
			gw.DefaultStrategy = pd.StrategyPredictive
			p, err := app.BuildPicker(app.PickerOptions{Gateway: gw, Logger: logr.Discard()})
			if err != nil {
				t.Fatal(err)
			}
			snap := predictivePool(c.annotation)
			d, err := p.Router.Schedule(context.Background(), completion(t, strings.Repeat("x", c.prompt), c.headers), snap, snap.Endpoints)
			if c.status != 0 {
				var ae *apierror.Error
				if !errors.As(err, &ae) || ae.Status != c.status || ae.Reason != c.reason {
					t.Fatalf("error %v, want %d %s", err, c.status, c.reason)
				}
				if c.status == http.StatusBadRequest && ae.Param == "" {
					t.Errorf("a 400 names the header: %+v", ae)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Trace.Scores["predicted_ttft_ms"] == "" || d.Trace.Scores["predicted_tpot_ms"] == "" {
				t.Errorf("trace scores %v lack the prediction", d.Trace.Scores)
			}
			_, hasPrefiller := d.SetHeaders[pd.HeaderPrefillerHostPort]
			if (d.Outcome == picker.OutcomePD) != hasPrefiller || (d.Outcome == picker.OutcomePD) != (len(d.Prefill) > 0) {
				t.Errorf("outcome %s, prefill %v, prefiller header %v", d.Outcome, names(d.Prefill), hasPrefiller)
			}
			d.Lifecycle.Done(nil)
		})
	}
}
