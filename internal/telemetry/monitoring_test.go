package telemetry

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// collectExprs walks decoded JSON and returns every "expr" string.
func collectExprs(v any, out *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if s, ok := val.(string); ok && k == "expr" {
				*out = append(*out, s)
				continue
			}
			collectExprs(val, out)
		}
	case []any:
		for _, val := range x {
			collectExprs(val, out)
		}
	}
}

var (
	stringRE   = regexp.MustCompile(`"[^"]*"`)
	matcherRE  = regexp.MustCompile(`\{[^}]*\}`)
	rangeRE    = regexp.MustCompile(`\[[^\]]*\]`)
	groupingRE = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	identRE    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promqlWord = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true,
		"without": true, "on": true, "ignoring": true, "inf": true, "nan": true, "Inf": true, "NaN": true}
)

// metricNames returns the metric names a PromQL expression selects: identifiers outside strings,
// label matchers, ranges and grouping clauses that are neither functions nor keywords.
func metricNames(expr string) []string {
	e := stringRE.ReplaceAllString(expr, `""`)
	e = matcherRE.ReplaceAllString(e, "")
	e = rangeRE.ReplaceAllString(e, "")
	e = groupingRE.ReplaceAllString(e, "")
	var names []string
	for _, loc := range identRE.FindAllStringIndex(e, -1) {
		id := e[loc[0]:loc[1]]
		if loc[0] > 0 && (e[loc[0]-1] >= '0' && e[loc[0]-1] <= '9' || e[loc[0]-1] == '.') {
			continue // the exponent or unit of a number, e.g. 1e3
		}
		rest := strings.TrimLeft(e[loc[1]:], " \t\n")
		if strings.HasPrefix(rest, "(") || promqlWord[id] {
			continue
		}
		names = append(names, id)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	cases := []struct{ expr, want string }{
		{`sum by (role) (rate(tandem_decisions_total{outcome="pd"}[5m]))`, "tandem_decisions_total"},
		{`histogram_quantile(0.99, sum by (le) (rate(tandem_pick_duration_seconds_bucket[$__rate_interval]))) > 0.01`, "tandem_pick_duration_seconds_bucket"},
		{`max(a_b) > 3 * avg(c) and max(a_b) > 2e4`, "a_b,c,a_b"},
		{`sum(x) / count(y) > 0.5`, "x,y"},
	}
	for _, c := range cases {
		if got := strings.Join(metricNames(c.expr), ","); got != c.want {
			t.Errorf("%s: got %s, want %s", c.expr, got, c.want)
		}
	}
}

// TestMonitoringQueries checks that every metric the dashboard and the alert rules query is one
// Tandem exports, and that every query selects at least one.
func TestMonitoringQueries(t *testing.T) {
	m, _ := newMetrics(t)
	exported := map[string]string{}
	for _, d := range m.Defs() {
		exported[d.Name] = d.Type
	}
	known := func(name string) bool {
		if _, ok := exported[name]; ok || name == "up" { // up: Prometheus's own series per scrape target
			return true
		}
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suf); ok && exported[base] == "histogram" {
				return true
			}
		}
		return false
	}

	dir := filepath.Join("..", "..", "manifests", "monitoring")
	var docs []any
	raw, err := os.ReadFile(filepath.Join(dir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	docs = append(docs, dash)
	raw, err = os.ReadFile(filepath.Join(dir, "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	var rules any
	if err := json.Unmarshal(js, &rules); err != nil {
		t.Fatal(err)
	}
	docs = append(docs, rules)

	var exprs []string
	for _, d := range docs {
		collectExprs(d, &exprs)
	}
	if len(exprs) < 20 {
		t.Fatalf("found only %d queries in manifests/monitoring", len(exprs))
	}
	used := map[string]bool{}
	for _, e := range exprs {
		names := metricNames(e)
		if len(names) == 0 {
			t.Errorf("query selects no metric: %s", e)
		}
		for _, n := range names {
			if !known(n) {
				t.Errorf("query uses %s, which Tandem does not export: %s", n, e)
			}
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
		}
	}
	// The failure modes the brief names must each have a rule.
	alerts := string(js)
	for _, name := range []string{"tandem_pd_rolesets", "gateway_pd_prefill_failure_total", "gateway_pd_decode_watchdog_total",
		"tandem_scrape_stale", "tandem_pick_duration_seconds_bucket", "tandem_endpoint_running_requests"} {
		if !strings.Contains(alerts, name) {
			t.Errorf("no alert rule queries %s", name)
		}
	}
}
