package pd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// pairsOnlyPredictiveFile is pd-predictive's pair step without its placement deciders: every
// request is disaggregated.
const pairsOnlyPredictiveFile = `
plugins:
- {type: pd-role-filter, name: prefill-pods, parameters: {role: prefill}}
- {type: pd-role-filter, name: decode-pods, parameters: {role: decode}}
- {type: prefill-policy-scorer, parameters: {policy: predicted_ttft}}
- {type: decode-policy-scorer, parameters: {policy: predicted_tpot}}
- {type: roleset-pd-profile-handler, name: pairs}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-pods}, {pluginRef: prefill-policy-scorer}]
- name: decode
  plugins: [{pluginRef: decode-pods}, {pluginRef: decode-policy-scorer}]
`

// pd-predictive's pairing on one roleset spread over two zones (a prefill and a decode pod in each),
// requests two at a time (the second finds the first's pods busy): a KV transfer within a
// zone takes 10 ms, across zones 300 ms. Topology-blind pairing picks each side by its load
// and pairs across zones about half the time; topology-aware pairing prefers the pairs in a
// zone and, once a decode pod has seen 3 pulls from the other zone, knows what they cost:
// at most a tenth of its later pairs cross.
func TestPredictiveLearnsPairDistance(t *testing.T) {
	eps := []*pool.Endpoint{}
	for i, p := range []struct{ name, role, zone string }{{"pA", "prefill", "a"}, {"pB", "prefill", "b"}, {"dA", "decode", "a"}, {"dB", "decode", "b"}} {
		eps = append(eps, pool.NewEndpoint("ns", p.name, "10.6.0."+string(rune('1'+i)), 8000, 0, map[string]string{
			pool.LabelRoleName: p.role, pool.LabelRolesetName: "rs", pool.LabelModelName: "m",
			config.LabelHostname: "node-" + p.name, config.LabelZone: p.zone}, nil))
	}
	snap := pool.NewStore().Publish(pool.Info{}, eps, true)
	zone := func(e *pool.Endpoint) string { return e.Labels[config.LabelZone] }
	cross := func(topology config.TopologyLabels) (early, late, pairs int) {
		clock := load.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		gw := config.DefaultGateway()
		gw.PD.Topology = topology
		f, err := config.ParseFile("epp.yaml", []byte(pairsOnlyPredictiveFile), config.FileOptions{KnownPluginTypes: pd.IsPluginType})
		if err != nil {
			t.Fatal(err)
		}
		p, err := app.BuildPicker(app.PickerOptions{Clock: clock, Gateway: gw, File: f, Logger: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Repeat("far and near ", 2500) // ≈ 8k tokens
		for i := range 200 {
			// Two requests at once: the second finds the first's prefill and decode pods busy.
			var ds []*picker.Decision
			for range 2 {
				d, err := p.Router.Schedule(context.Background(), completion(t, text, map[string]string{wire.HeaderSLOTTFT: "2000"}), snap, snap.Endpoints)
				if err != nil {
					t.Fatal(err)
				}
				ds = append(ds, d)
			}
			clock.Advance(200 * time.Millisecond)
			transfer := make([]time.Duration, len(ds))
			for k, d := range ds {
				if d.Outcome != picker.OutcomePD {
					t.Fatalf("request %d: outcome %s, want a pair", 2*i+k, d.Outcome)
				}
				d.Lifecycle.(pd.PrefillObserver).PrefillDone(nil)
				transfer[k] = 10 * time.Millisecond
				if i >= 100 {
					pairs++
				}
				if zone(d.Prefill[0]) != zone(d.Destination[0]) {
					transfer[k] = 300 * time.Millisecond
					if i < 100 {
						early++
					} else {
						late++
					}
				}
			}
			order := []int{0, 1} // first bytes in order of their transfers' ends
			if transfer[1] < transfer[0] {
				order = []int{1, 0}
			}
			at := time.Duration(0)
			for _, k := range order {
				clock.Advance(transfer[k] + 10*time.Millisecond - at)
				at = transfer[k] + 10*time.Millisecond
				ds[k].Lifecycle.ResponseHeaders(200, ds[k].Destination[0])
			}
			for range 20 {
				clock.Advance(10 * time.Millisecond)
				for _, d := range ds {
					d.Lifecycle.ResponseBody(16, false)
				}
			}
			for _, d := range ds {
				d.Lifecycle.Done(nil)
			}
			clock.Advance(time.Second)
		}
		return early, late, pairs
	}
	awareEarly, aware, awarePairs := cross(config.DefaultTopologyLabels())
	blindEarly, blind, blindPairs := cross(config.TopologyLabels{})
	t.Logf("pairs across zones, requests 1-200 / 201-400: aware %d / %d of %d, blind %d / %d of %d", awareEarly, aware, awarePairs, blindEarly, blind, blindPairs)
	if awarePairs < 50 || blindPairs < 50 {
		t.Fatalf("%d and %d of the last 200 requests were disaggregated: too few to compare", awarePairs, blindPairs)
	}
	if aware*10 > awarePairs || blind*4 < blindPairs {
		t.Errorf("of the last pairs, %d of %d crossed zones topology-aware (want at most 10 %%) and %d of %d topology-blind (want at least 25 %%)", aware, awarePairs, blind, blindPairs)
	}
}
