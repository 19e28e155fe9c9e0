package app

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/request"
)

// An llm-d pool: two prefill and two decode pods labelled llm-d.ai/role, no rolesets.
const llmdPool = `
endpoints:
- {name: prefill-0, address: 127.0.0.1, port: 18110, labels: {llm-d.ai/role: prefill, model.aibrix.ai/name: m}}
- {name: prefill-1, address: 127.0.0.1, port: 18111, labels: {llm-d.ai/role: prefill, model.aibrix.ai/name: m}}
- {name: decode-0, address: 127.0.0.1, port: 18210, labels: {llm-d.ai/role: decode, model.aibrix.ai/name: m}}
- {name: decode-1, address: 127.0.0.1, port: 18211, labels: {llm-d.ai/role: decode, model.aibrix.ai/name: m}}
`

// The binary takes llm-d-router v0.10.0's deploy/config/pd-epp-config.yaml unchanged as its
// --config-file and routes an uncached chat request over the real ext_proc stream as llm-d
// does: a decode pod in x-gateway-destination-endpoint, a prefill pod in x-prefiller-host-port.
func TestLLMDConfigFileThroughExtProc(t *testing.T) {
	cfg := filepath.Join("..", "pd", "testdata", "llm-d-router-v0.10.0", "pd-epp-config.yaml")
	a := startApp(t, "--endpoints-file="+writePool(t, llmdPool), "--config-file="+cfg)
	c, err := envoy.Dial(a.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waitSynced(t, a)
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": strings.Repeat("tell me a story. ", 200)}}})
	_, r, err := c.Route(ctx, envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: body})
	if err != nil {
		t.Fatal(err)
	}
	if r.Immediate != nil {
		t.Fatalf("immediate %d: %s", r.Immediate.Status, r.Immediate.Body)
	}
	if got := r.Endpoints(); len(got) == 0 || !strings.HasPrefix(got[0], "127.0.0.1:182") {
		t.Fatalf("destination %v, want a decode pod", got)
	}
	if got := r.Headers.Set["x-prefiller-host-port"]; !strings.HasPrefix(got, "127.0.0.1:181") {
		t.Fatalf("x-prefiller-host-port = %q, want a prefill pod", got)
	}
}

// A --config-file changed while Tandem runs is applied at once, whole; a bad version is
// rejected with the line that is wrong, counted, and the last good configuration keeps
// routing.
func TestConfigFileReload(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "epp.yaml")
	write := func(body string) {
		t.Helper()
		tmp := filepath.Join(dir, "next")
		if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfg); err != nil { // as a ConfigMap update swaps the file
			t.Fatal(err)
		}
	}
	profile := func(name string) string {
		return "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: " + name + "\n  plugins:\n  - pluginRef: queue-scorer\n"
	}
	write(profile("default"))
	opts := []string{"--endpoints-file=" + writePool(t, pdPool), "--config-file=" + cfg}
	a := startAppWith(t, func(o *Options) { o.configPoll = 20 * time.Millisecond }, opts...)
	waitSynced(t, a)
	strategyOf := func() string {
		t.Helper()
		r, err := request.Parse("POST", "/v1/completions", map[string]string{}, []byte(`{"model":"m","prompt":"hello"}`))
		if err != nil {
			t.Fatal(err)
		}
		snap := a.Store().Load()
		d, err := a.router.Schedule(context.Background(), r, snap, snap.Endpoints)
		if err != nil {
			t.Fatal(err)
		}
		d.Lifecycle.Done(nil)
		return d.Strategy
	}
	if got := strategyOf(); got != "default" {
		t.Fatalf("at start: strategy %q, want the file's default profile", got)
	}

	write(profile("fast"))
	waitUntil(t, "the renamed profile routes", func() bool { return strategyOf() == "fast" })
	if a.router.Strategy("default") != nil {
		t.Fatal("the old profile is still a strategy after the reload")
	}
	if got := gauge(t, a, "tandem_config_file_applied"); got != 1 {
		t.Fatalf("tandem_config_file_applied = %v after a good reload", got)
	}

	write("plugins:\n- type: queue-scorer\n  parameters: {depth: 3}\nschedulingProfiles:\n- name: slow\n  plugins:\n  - pluginRef: queue-scorer\n")
	waitUntil(t, "the bad file is counted", func() bool {
		return counter(t, a, "tandem_config_reloads_total", map[string]string{"result": "rejected"}) == 1
	})
	if got := strategyOf(); got != "fast" {
		t.Fatalf("after a rejected file: strategy %q, want the last good %q", got, "fast")
	}
	if got := gauge(t, a, "tandem_config_file_applied"); got != 0 {
		t.Fatalf("tandem_config_file_applied = %v after a rejected file", got)
	}
	if applied := counter(t, a, "tandem_config_reloads_total", map[string]string{"result": "applied"}); applied != 1 {
		t.Fatalf("%v reloads applied, want 1", applied)
	}
}

func metricFamily(t *testing.T, a *App, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := a.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

func gauge(t *testing.T, a *App, name string) float64 {
	t.Helper()
	if mf := metricFamily(t, a, name); mf != nil && len(mf.GetMetric()) > 0 {
		return mf.GetMetric()[0].GetGauge().GetValue()
	}
	return -1
}
