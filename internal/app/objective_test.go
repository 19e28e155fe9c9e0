package app

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/wire"
)

// A PD pair and a standard pod under pd-predictive, with objectives in the file: a request
// naming a negative-priority objective is refused (429) when no pod is predicted to meet its
// TTFT objective, and routed when one is; one naming an unknown objective has the default
// priority (0) and is routed, as GIE's EPP does.
const objectivePool = `
objectives:
- {name: batch, priority: -1}
- {name: chat, priority: 5}
endpoints:
- name: prefill-0
  address: 127.0.0.1
  port: 18100
  labels: {role-name: prefill, roleset-name: group-0, model.aibrix.ai/name: m}
- name: decode-0
  address: 127.0.0.1
  port: 18200
  labels: {role-name: decode, roleset-name: group-0, model.aibrix.ai/name: m, llm-d.ai/role: decode}
- name: standard-0
  address: 127.0.0.1
  port: 18300
  labels: {model.aibrix.ai/name: m}
  annotations:
    model.aibrix.ai/config: '{"profiles":{"default":{"routingConfig":{"combined":true}}}}'
`

func TestObjectiveFromEndpointsFileSheds(t *testing.T) {
	// The pods do not run: passive health would eject them at their first refused scrape,
	// a race with the requests below that this test is not about.
	a := startAppEnv(t, map[string]string{"TANDEM_OUTLIER_DETECTION": "false"}, "--endpoints-file="+writePool(t, objectivePool))
	waitSynced(t, a)
	if got := a.objectives.Len(); got != 2 {
		t.Fatalf("objectives loaded: %d, want 2", got)
	}
	checkObjectiveShedding(t, a)
}

// checkObjectiveShedding drives a running app whose pool has a PD pair and a standard pod and
// whose objectives include batch (priority -1) and chat (priority 5).
func checkObjectiveShedding(t *testing.T, a *App) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := envoy.Dial(a.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// send routes one pd-predictive request of prompt bytes with a 300 ms TTFT objective; the
	// stream stays open (the request in flight, its prefill booked) until the test ends.
	send := func(objective string, prompt int) *envoy.Routed {
		t.Helper()
		s, err := c.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": strings.Repeat("x", prompt), "max_tokens": 10})
		hs := []envoy.Header{{Key: "content-type", Value: "application/json"}, {Key: "routing-strategy", Value: "pd-predictive"}, {Key: wire.HeaderSLOTTFT, Value: "300"}}
		if objective != "" {
			hs = append(hs, envoy.Header{Key: wire.HeaderInferenceObjective, Value: objective})
		}
		req := envoy.Request{Method: "POST", Path: "/v1/completions", Headers: hs, Body: body}
		if err := s.SendRequest(req); err != nil {
			t.Fatal(err)
		}
		r, err := s.ReadRoute(req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	routed := func(what string, r *envoy.Routed) {
		t.Helper()
		if r.Immediate != nil {
			t.Fatalf("%s: answered %d %s, want routed", what, r.Immediate.Status, r.Immediate.Body)
		}
		if len(r.Endpoints()) == 0 {
			t.Fatalf("%s: no destination", what)
		}
	}

	// A short prompt meets the objective: the sheddable request is served.
	routed("batch, short prompt", send("batch", 400))
	// 10k tokens take about 0.5 s on any pod (new pods' models): no pod is predicted to meet
	// the 300 ms objective, as when every pod is saturated.
	r := send("batch", 40000)
	if r.Immediate == nil || r.Immediate.Status != http.StatusTooManyRequests {
		t.Fatalf("batch (priority -1), out of reach everywhere: routed to %v, want a 429", r.Endpoints())
	}
	// Not sheddable: routed anyway, late.
	routed("chat (priority 5), out of reach", send("chat", 40000))
	routed("unknown objective (default priority 0), out of reach", send("no-such-objective", 40000))
	routed("no objective, out of reach", send("", 40000))
}
