package telemetry

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/proof"
)

var update = flag.Bool("update", false, "rewrite the table in docs/metrics.md from the registry")

func newMetrics(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func ep(ns, name string, port int32, role, roleset string) *pool.Endpoint {
	return pool.NewEndpoint(ns, name, "10.0.0.1", port, 0,
		map[string]string{pool.LabelRoleName: role, pool.LabelRolesetName: roleset}, nil)
}

// exercise calls every method once so that every metric has a series to gather.
func exercise(m *Metrics) {
	p, d := ep("ns", "p-0", 8000, "prefill", "rs-a"), ep("ns", "d-0", 8000, "decode", "rs-a")
	closed := m.StreamOpened()
	m.RequestBody(2048)
	m.Decision("pd", OutcomePD, "score", 300*time.Microsecond)
	m.PluginLatency("prefill-scorer", 50*time.Microsecond)
	m.TimeToFirstToken("m", pool.RoleDecode, 200*time.Millisecond)
	m.InterTokenLatency("m", pool.RoleDecode, 20*time.Millisecond)
	m.TTFTPrediction("pd", d.Key(), 100*time.Millisecond, 125*time.Millisecond)
	m.RequestModelFail("m", "pd_decode_watchdog", "", 504)
	m.PrefillRequestSuccess()
	m.PrefillRequestFail("pd-do-prefill-request-error", 500)
	m.PrefillFailure("timeout", "before_response")
	m.DecodeAbort("timeout", "ok")
	m.DecodeWatchdog("first_response")
	m.PrefillRelease("sglang", "sent")
	m.StrandedKV(p, "consumed", 0.5)
	m.SelectedPair(p, d)
	m.Transfer(proof.Recomputed, "default/p-0", "default/d-0")
	m.SetTokenLoad("ns", "p-0", 3600, 3600)
	m.SetDecodeTokens("ns", "d-0", 100)
	m.BucketServeBand("rs-a", 900)
	m.SetBucketServeBandMax("rs-a", 4095)
	m.PoolChanged(mustSnapshot(p, d))
	m.ScrapeDone(d, time.Millisecond, metrics.ErrClassTimeout)
	m.EndpointSample(d, &metrics.Sample{Running: 3, HasRunning: true, Waiting: 1, HasWaiting: true, KVUsage: 0.5, HasKVUsage: true})
	m.ConfigError(d, "annotation", fmt.Errorf("bad"))
	m.PanicRecovered("extproc_stream")
	m.ClientFieldsRemoved([]string{"kv_transfer_params"})
	m.ConfigReload(true)
	m.OutlierEjected(d, "consecutive_5xx")
	m.OutlierReturned(d, 30*time.Second, "scrape")
	m.OutlierOverflow(d, "consecutive_5xx", "max_ejection_percent")
	m.OutlierFiltered("ejected")
	m.PrefillRetry("recovered")
	m.RedisValuesRejected("prefill_busy_until", 2)
	closed()
}

func mustSnapshot(eps ...*pool.Endpoint) *pool.Snapshot {
	return pool.NewStore().Publish(pool.Info{}, eps, true)
}

type family struct {
	typ    string
	labels []string
}

func gather(t *testing.T, reg *prometheus.Registry) map[string]family {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]family{}
	for _, mf := range mfs {
		var labels []string
		if len(mf.GetMetric()) > 0 {
			for _, lp := range mf.GetMetric()[0].GetLabel() {
				labels = append(labels, lp.GetName())
			}
		}
		sort.Strings(labels)
		out[mf.GetName()] = family{typ: strings.ToLower(mf.GetType().String()), labels: labels}
	}
	return out
}

var rowRE = regexp.MustCompile("^\\| `([a-z_:]+)` \\| (counter|gauge|histogram) \\| ([^|]*) \\| ([^|]+) \\|$")

const (
	tableStart = "<!-- metrics-table:start -->"
	tableEnd   = "<!-- metrics-table:end -->"
)

func docsPath() string { return filepath.Join("..", "..", "docs", "metrics.md") }

func renderTable(defs []Def) string {
	var b strings.Builder
	b.WriteString("| Name | Type | Labels | Meaning |\n|---|---|---|---|\n")
	for _, d := range defs {
		ls := make([]string, len(d.Labels))
		for i, l := range d.Labels {
			ls[i] = "`" + l + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", d.Name, d.Type, strings.Join(ls, ", "), d.Help)
	}
	return b.String()
}

// TestDocsTable checks docs/metrics.md against the registry both ways: every gathered family is
// in the table with its type and labels, and every table row is a gathered family.
// `go test ./internal/telemetry -run TestDocsTable -update` rewrites the table.
func TestDocsTable(t *testing.T) {
	m, reg := newMetrics(t)
	exercise(m)
	got := gather(t, reg)
	if len(got) != len(m.Defs()) {
		t.Fatalf("gathered %d families but %d are defined: exercise() misses some", len(got), len(m.Defs()))
	}

	checkDocsTable(t, m, got, docsPath())
}

func checkDocsTable(t *testing.T, m *Metrics, got map[string]family, path string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, tableStart), strings.Index(doc, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the %s … %s markers", path, tableStart, tableEnd)
	}
	if *update {
		doc = doc[:i+len(tableStart)] + "\n" + renderTable(m.Defs()) + doc[j:]
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		i, j = strings.Index(doc, tableStart), strings.Index(doc, tableEnd)
	}

	documented := map[string]family{}
	for _, line := range strings.Split(doc[i:j], "\n") {
		mm := rowRE.FindStringSubmatch(strings.TrimSpace(line))
		if mm == nil {
			continue
		}
		var labels []string
		for _, l := range strings.Split(mm[3], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" {
				labels = append(labels, l)
			}
		}
		sort.Strings(labels)
		documented[mm[1]] = family{typ: mm[2], labels: labels}
	}
	for name, f := range got {
		d, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("%s is exported but not in %s", name, path)
		case d.typ != f.typ:
			t.Errorf("%s: %s says %s, registry has %s", name, path, d.typ, f.typ)
		case strings.Join(d.labels, ",") != strings.Join(f.labels, ","):
			t.Errorf("%s: docs list labels %v, registry has %v", name, d.labels, f.labels)
		}
	}
	for name := range documented {
		if _, ok := got[name]; !ok {
			t.Errorf("%s lists %s, which Tandem does not export", path, name)
		}
	}
}

func seriesWith(t *testing.T, reg *prometheus.Registry, name, label, value string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if name != "" && mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, lp := range s.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					n++
				}
			}
		}
	}
	return n
}

func TestBoundedModelLabel(t *testing.T) {
	m, reg := newMetrics(t)
	for i := range 100 {
		m.TimeToFirstToken(fmt.Sprintf("model-%d", i), pool.RoleDecode, time.Second)
	}
	models := map[string]bool{}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "tandem_time_to_first_token_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			models[labelValue(s, "model")] = true
		}
	}
	if len(models) != maxModels+1 || !models[otherValue] {
		t.Errorf("got %d model values (other: %v), want %d distinct + %q", len(models), models[otherValue], maxModels, otherValue)
	}
}

func labelValue(s *dto.Metric, name string) string {
	for _, lp := range s.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// TestPodLeaves checks that a pod that leaves the pool takes all its series with it.
func TestPodLeaves(t *testing.T) {
	m, reg := newMetrics(t)
	p0, p1 := ep("ns", "p-0", 8000, "prefill", "rs"), ep("ns", "p-1", 8000, "prefill", "rs")
	d0 := ep("ns", "d-0", 8000, "decode", "rs")
	m.PoolChanged(mustSnapshot(p0, p1, d0))
	for _, e := range []*pool.Endpoint{p0, p1} {
		m.SetTokenLoad(e.Namespace, e.Name, 10, 20)
		m.SelectedPair(e, d0)
		m.ScrapeDone(e, time.Millisecond, metrics.ErrClassConnect)
		m.EndpointSample(e, &metrics.Sample{Running: 1, HasRunning: true})
		m.ConfigError(e, "annotation", nil)
		m.StrandedKV(e, "released", 1)
		m.Transfer("verified", e.PodKey(), d0.PodKey())
	}
	if n := seriesWith(t, reg, "tandem_pd_transfer_total", "prefill_pod", "ns/p-0"); n != 1 {
		t.Fatalf("p-0 has %d transfer series before leaving, want 1", n)
	}
	if n := seriesWith(t, reg, "", "pod_name", "p-0"); n < 7 {
		t.Fatalf("p-0 has %d series before leaving, want at least 7", n)
	}
	m.PoolChanged(mustSnapshot(p1, d0))
	if n := seriesWith(t, reg, "", "pod_name", "p-0"); n != 0 {
		t.Errorf("p-0 left the pool but %d of its series remain", n)
	}
	if n := seriesWith(t, reg, "tandem_pd_transfer_total", "prefill_pod", "ns/p-0"); n != 0 {
		t.Errorf("p-0 left the pool but %d of its transfer series remain", n)
	}
	if n := seriesWith(t, reg, "tandem_pd_transfer_total", "prefill_pod", "ns/p-1"); n != 1 {
		t.Errorf("p-1 stayed but has %d transfer series, want 1", n)
	}
	m.Transfer("verified", p0.PodKey(), d0.PodKey()) // a verdict that ends after p-0 left
	if n := seriesWith(t, reg, "tandem_pd_transfer_total", "prefill_pod", "ns/p-0"); n != 0 {
		t.Errorf("a verdict after p-0 left recreated %d transfer series", n)
	}
	// A hold of p-0 that ends after it left (a late expiry timer) does not bring a series back.
	m.StrandedKV(p0, "expired", 480)
	if n := seriesWith(t, reg, "tandem_pd_stranded_kv_seconds_total", "pod_name", "p-0"); n != 0 {
		t.Errorf("a hold ending after p-0 left recreated %d stranded-KV series", n)
	}
	if n := seriesWith(t, reg, "", "pod_name", "p-1"); n < 6 {
		t.Errorf("p-1 stayed but has %d series, want at least 6", n)
	}
	m.DeleteTokenLoad("ns", "p-1")
	if n := seriesWith(t, reg, "pd_token_load_active_tokens", "pod_name", "p-1"); n != 0 {
		t.Errorf("DeleteTokenLoad left %d series", n)
	}
}

func TestStaleDropsLoad(t *testing.T) {
	m, reg := newMetrics(t)
	d := ep("ns", "d-0", 8000, "decode", "rs")
	m.EndpointSample(d, &metrics.Sample{Running: 4, HasRunning: true, KVUsage: 0.9, HasKVUsage: true})
	m.EndpointStale(d, true)
	if n := seriesWith(t, reg, "tandem_endpoint_running_requests", "pod_name", "d-0"); n != 0 {
		t.Errorf("a stale endpoint still has %d running-request series", n)
	}
	if v := gaugeValue(t, reg, "tandem_scrape_stale", "d-0"); v != 1 {
		t.Errorf("tandem_scrape_stale = %v, want 1", v)
	}
	m.EndpointStale(d, false)
	if v := gaugeValue(t, reg, "tandem_scrape_stale", "d-0"); v != 0 {
		t.Errorf("after recovery tandem_scrape_stale = %v, want 0", v)
	}
	m.EndpointGone(d)
	if n := seriesWith(t, reg, "", "pod_name", "d-0"); n != 0 {
		t.Errorf("a gone endpoint has %d series", n)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name, pod string) float64 {
	t.Helper()
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			if labelValue(s, "pod_name") == pod || pod == "" {
				return s.GetGauge().GetValue()
			}
		}
	}
	return -1
}

func TestRolesetsAndRoles(t *testing.T) {
	m, reg := newMetrics(t)
	m.PoolChanged(mustSnapshot(
		ep("ns", "a-p", 8000, "prefill", "a"), ep("ns", "a-d", 8000, "decode", "a"), // complete
		ep("ns", "b-p", 8000, "prefill", "b"),                                      // prefill without decode
		ep("ns", "c-d", 8000, "decode", "c"), ep("ns", "c-d", 8001, "decode", "c"), // decode without prefill
		ep("ns", "s", 8000, "", ""), // standard
	))
	want := map[string]float64{"complete": 1, "incomplete": 2}
	roles := map[string]float64{"prefill": 2, "decode": 3, "standard": 1}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			switch mf.GetName() {
			case "tandem_pd_rolesets":
				if v := s.GetGauge().GetValue(); v != want[labelValue(s, "state")] {
					t.Errorf("rolesets %s = %v, want %v", labelValue(s, "state"), v, want[labelValue(s, "state")])
				}
			case "tandem_pool_endpoints":
				if v := s.GetGauge().GetValue(); v != roles[labelValue(s, "role")] {
					t.Errorf("endpoints %s = %v, want %v", labelValue(s, "role"), v, roles[labelValue(s, "role")])
				}
			}
		}
	}
}

func TestResponseTimer(t *testing.T) {
	m, reg := newMetrics(t)
	t0 := time.Unix(100, 0)
	rt := m.NewResponseTimer("m", pool.RoleDecode, t0)
	// First token after 250 ms, then chunks 20 ms and 30 ms apart; an empty end-of-stream chunk.
	rt.BodyChunk(t0.Add(250*time.Millisecond), 40)
	rt.BodyChunk(t0.Add(270*time.Millisecond), 40)
	rt.BodyChunk(t0.Add(300*time.Millisecond), 40)
	rt.BodyChunk(t0.Add(900*time.Millisecond), 0)
	mfs, _ := reg.Gather()
	got := map[string][2]float64{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			if h := s.GetHistogram(); h != nil && labelValue(s, "role") == "decode" {
				got[mf.GetName()] = [2]float64{float64(h.GetSampleCount()), h.GetSampleSum()}
			}
		}
	}
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	if g := got["tandem_time_to_first_token_seconds"]; g[0] != 1 || !near(g[1], 0.25) {
		t.Errorf("TTFT count,sum = %v, want 1, 0.25", g)
	}
	if g := got["tandem_inter_token_latency_seconds"]; g[0] != 2 || !near(g[1], 0.05) {
		t.Errorf("ITL count,sum = %v, want 2, 0.05 (20 ms + 30 ms)", g)
	}
}

func TestDecisionOutcomeBounded(t *testing.T) {
	m, reg := newMetrics(t)
	m.Decision("pd", Outcome("made-up"), "step", time.Millisecond)
	if n := seriesWith(t, reg, "tandem_decisions_total", "outcome", otherValue); n != 1 {
		t.Errorf("an unknown outcome was not folded into %q", otherValue)
	}
	closed := m.StreamOpened()
	closed()
	closed()
	if v := gaugeValue(t, reg, "tandem_extproc_streams_open", ""); v != 0 {
		t.Errorf("streams open = %v after one stream closed twice, want 0", v)
	}
}

func TestNewNeedsRegistry(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Error("New(nil) did not fail")
	}
	reg := prometheus.NewRegistry()
	if _, err := New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg); err == nil {
		t.Error("registering twice on one registry did not fail")
	}
}

// TestModelLabelsAreBoundedByThePool: a model the pool's pods name keeps its name; one they do
// not name is "other" unless the pool answered it successfully before (pools whose pods name no
// model); a label value that is not valid UTF-8, from whatever source, is repaired instead of
// making the Prometheus client panic.
func TestModelLabelsAreBoundedByThePool(t *testing.T) {
	m, reg := newMetrics(t)
	if got := m.ModelLabel("m", true); got != "m" {
		t.Errorf("declared model: %q", got)
	}
	for i := range 200 {
		if got := m.ModelLabel(fmt.Sprintf("invented-%d", i), false); got != "other" {
			t.Fatalf("an invented model became label %q", got)
		}
	}
	m.ModelServed("served-by-an-unnamed-pool")
	if got := m.ModelLabel("served-by-an-unnamed-pool", false); got != "served-by-an-unnamed-pool" {
		t.Errorf("a model the pool answered: %q", got)
	}
	m.RequestModelFail("sim\xff", "upstream_error", "", 500) // used to panic
	m.PanicRecovered("where\xff")
	fams := gather(t, reg)
	if _, ok := fams["gateway_request_model_fail_total"]; !ok {
		t.Fatal("the failure with a repaired label was not counted")
	}
}
