package manifests_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// exprsOf returns every "expr" string in decoded JSON, in document order.
func exprsOf(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if s, ok := x[k].(string); ok && k == "expr" {
				out = append(out, s)
				continue
			}
			out = append(out, exprsOf(x[k])...)
		}
	case []any:
		for _, e := range x {
			out = append(out, exprsOf(e)...)
		}
	}
	return out
}

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// selectorRE finds a metric selector: a Tandem metric name or Prometheus's up, and its matchers.
var selectorRE = regexp.MustCompile(`\b((?:tandem|gateway|pd)_[a-z0-9_]+|up)\b(\{[^}]*\})?`)

// TestDashboardFiltersEveryQuery: the dashboard has namespace, job and pod variables, and every
// metric every panel queries is filtered by all three, so several EPPs never mix.
func TestDashboardFiltersEveryQuery(t *testing.T) {
	d := readJSON(t, filepath.Join("monitoring", "dashboard.json"))
	vars := map[string]map[string]any{}
	for _, v := range d["templating"].(map[string]any)["list"].([]any) {
		m := v.(map[string]any)
		vars[m["name"].(string)] = m
	}
	for _, name := range []string{"namespace", "job", "pod"} {
		v, ok := vars[name]
		if !ok {
			t.Errorf("no dashboard variable %q", name)
			continue
		}
		// All must also match series without the label (a scrape config without pod labels).
		if v["type"] != "query" || v["includeAll"] != true || v["multi"] != true || v["allValue"] != ".*" {
			t.Errorf("variable %s = %v, want a multi-value query variable with All = .*", name, v)
		}
	}
	var panels int
	for _, p := range d["panels"].([]any) {
		pm := p.(map[string]any)
		exprs := exprsOf(pm["targets"])
		if pm["type"] != "row" {
			panels++
			if len(exprs) == 0 {
				t.Errorf("panel %q has no query", pm["title"])
			}
		}
		for _, e := range exprs {
			sels := selectorRE.FindAllStringSubmatch(e, -1)
			if len(sels) == 0 {
				t.Errorf("panel %q: query selects no metric: %s", pm["title"], e)
			}
			for _, s := range sels {
				for _, m := range []string{`namespace=~"$namespace"`, `job=~"$job"`, `pod=~"$pod"`} {
					if !strings.Contains(s[2], m) {
						t.Errorf("panel %q: %s lacks %s in %s", pm["title"], s[1], m, e)
					}
				}
			}
		}
	}
	if panels < 25 {
		t.Errorf("only %d panels", panels)
	}
}

// ruleGroups reads the PrometheusRule's spec (the rule groups, as a rules file holds them).
func ruleGroups(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("monitoring", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	out, err := yaml.JSONToYAML(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type alertRule struct {
	Alert string `json:"alert"`
	Expr  string `json:"expr"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var spec struct {
		Groups []struct {
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(ruleGroups(t), &spec); err != nil {
		t.Fatal(err)
	}
	var out []alertRule
	for _, g := range spec.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// TestAlertsAggregateByNamespace: every aggregation in every alert keeps namespace, so one
// namespace's EPP never hides or triggers another's alert; an EPP down and an EPP absent alert exist.
func TestAlertsAggregateByNamespace(t *testing.T) {
	agg := regexp.MustCompile(`\b(sum|max|min|avg|count|topk|bottomk|quantile)\s*(by\s*\(([^)]*)\))?\s*\(`)
	names := map[string]string{}
	for _, r := range alertRules(t) {
		names[r.Alert] = r.Expr
		if strings.HasPrefix(strings.TrimSpace(r.Expr), "absent(") {
			continue // nothing to aggregate: fires when no EPP target exists at all
		}
		ms := agg.FindAllStringSubmatch(r.Expr, -1)
		if len(ms) == 0 {
			t.Errorf("%s aggregates nothing: %s", r.Alert, r.Expr)
		}
		for _, m := range ms {
			if !slices.Contains(strings.Fields(strings.ReplaceAll(m[3], ",", " ")), "namespace") {
				t.Errorf("%s: %s… does not keep namespace: %s", r.Alert, m[0], r.Expr)
			}
		}
	}
	if !strings.Contains(names["TandemEPPDown"], `up{job="tandem-epp"}`) || !strings.Contains(names["TandemEPPAbsent"], `absent(up{job="tandem-epp"})`) {
		t.Errorf("want TandemEPPDown on up{job=\"tandem-epp\"} and TandemEPPAbsent on absent(up{job=\"tandem-epp\"}); have %v", names)
	}
}

// TestRulesWithPromtool checks the rules with promtool and runs the rule unit tests in
// testdata/alerts-test.yaml (EPP down per namespace, absent, stale endpoints counted once across
// replicas).
func TestRulesWithPromtool(t *testing.T) {
	promtool := promtoolPath(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tandem-rules.yaml"), ruleGroups(t), 0o600); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts-test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts-test.yaml"), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "tandem-rules.yaml"}, {"test", "rules", "alerts-test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out.String())
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out.String())
	}
}

// promtoolPath returns the path of promtool: $TANDEM_PROMTOOL, else what hack/ensure-promtool.sh prints.
func promtoolPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TANDEM_PROMTOOL"); p != "" {
		return p
	}
	out, err := exec.Command(filepath.Join("..", "hack", "ensure-promtool.sh")).Output()
	if err != nil {
		t.Fatalf("hack/ensure-promtool.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}
