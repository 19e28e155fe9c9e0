package manifests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	adapterconfig "sigs.k8s.io/prometheus-adapter/pkg/config"
	"sigs.k8s.io/yaml"

	"github.com/tandem-epp/tandem/internal/pool"
	k8stest "github.com/tandem-epp/tandem/internal/testenv"
)

// The autoscaling directories: two ways to follow the P:D advisor's recommended pod counts (a
// cluster uses one of them) and the Prometheus Adapter rule the HPA way needs.
const (
	hpaDir     = "autoscaling/hpa"
	kedaDir    = "autoscaling/keda"
	adapterDir = "autoscaling/prometheus-adapter"
	// kedaCRDs holds KEDA's ScaledObject CRD, copied from its v2.20.2 release.
	kedaCRDs = "testdata/keda"
)

// The advisor's gauges (fixed names) and the namespace autoscaling/keda's queries name: the one
// manifests/README.md applies everything into.
const (
	recommendedPods  = "tandem_recommended_pods"
	adviceConfidence = "tandem_advice_confidence"
	kedaNamespace    = "llm"
)

// roleTarget is what an autoscaler of one sample Deployment must select on.
type roleTarget struct{ model, role string }

// sampleTargets maps each Deployment of samples/pd-vllm to its pods' model and role.
func sampleTargets(t *testing.T) map[string]roleTarget {
	t.Helper()
	out := map[string]roleTarget{}
	for _, o := range render(t, "samples/pd-vllm") {
		d := typed[appsv1.Deployment](t, []*unstructured.Unstructured{o}, "Deployment", o.GetName())
		role, _, _ := pool.Classify(d.Spec.Template.Labels)
		out[d.Name] = roleTarget{model: d.Spec.Template.Labels[pool.LabelModelName], role: string(role)}
	}
	return out
}

// scaledObject is the part of a KEDA ScaledObject these tests read (the apiserver, with KEDA's
// CRD, checks the whole).
type scaledObject struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		ScaleTargetRef  autoscalingv2.CrossVersionObjectReference `json:"scaleTargetRef"`
		MinReplicaCount *int32                                    `json:"minReplicaCount"`
		MaxReplicaCount *int32                                    `json:"maxReplicaCount"`
		Advanced        struct {
			HorizontalPodAutoscalerConfig struct {
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior"`
			} `json:"horizontalPodAutoscalerConfig"`
		} `json:"advanced"`
		Triggers []struct {
			Type       string            `json:"type"`
			MetricType string            `json:"metricType"`
			Metadata   map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

func hpas(t *testing.T) []autoscalingv2.HorizontalPodAutoscaler {
	t.Helper()
	var out []autoscalingv2.HorizontalPodAutoscaler
	for _, o := range render(t, hpaDir) {
		out = append(out, *typed[autoscalingv2.HorizontalPodAutoscaler](t, []*unstructured.Unstructured{o}, "HorizontalPodAutoscaler", o.GetName()))
	}
	return out
}

func scaledObjects(t *testing.T) []scaledObject {
	t.Helper()
	var out []scaledObject
	for _, o := range render(t, kedaDir) {
		var so scaledObject
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &so); err != nil {
			t.Fatalf("ScaledObject %s: %v", o.GetName(), err)
		}
		out = append(out, so)
	}
	return out
}

// checkTarget checks an autoscaler scales a sample Deployment and returns what it must select.
func checkTarget(t *testing.T, what string, ref autoscalingv2.CrossVersionObjectReference, samples map[string]roleTarget, seen map[string]bool) (roleTarget, bool) {
	t.Helper()
	target, ok := samples[ref.Name]
	if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || !ok {
		t.Errorf("%s scales %s %s/%s, not a Deployment of samples/pd-vllm (%v)", what, ref.APIVersion, ref.Kind, ref.Name, slices.Sorted(maps.Keys(samples)))
		return roleTarget{}, false
	}
	if seen[ref.Name] {
		t.Errorf("%s: a second autoscaler for %s", what, ref.Name)
	}
	seen[ref.Name] = true
	return target, true
}

// checkBehavior: scaling waits out a stabilization window of at least five minutes, the same
// both ways and at the same pace, so the role that gains pods and the one that loses them move
// together and the total the advisor split stays put; a tolerance of 0 lets a one-pod change of
// the count through.
func checkBehavior(t *testing.T, what string, b *autoscalingv2.HorizontalPodAutoscalerBehavior) {
	t.Helper()
	if b == nil || b.ScaleUp == nil || b.ScaleDown == nil {
		t.Errorf("%s: behavior %+v, want scaleUp and scaleDown", what, b)
		return
	}
	for dir, r := range map[string]*autoscalingv2.HPAScalingRules{"scaleUp": b.ScaleUp, "scaleDown": b.ScaleDown} {
		if r.StabilizationWindowSeconds == nil || *r.StabilizationWindowSeconds < 300 {
			t.Errorf("%s: %s stabilization window %v, want at least 300 s", what, dir, r.StabilizationWindowSeconds)
		}
		if r.Tolerance == nil || !r.Tolerance.IsZero() {
			t.Errorf("%s: %s tolerance %v, want 0", what, dir, r.Tolerance)
		}
	}
	up, down := b.ScaleUp, b.ScaleDown
	if up.StabilizationWindowSeconds != nil && down.StabilizationWindowSeconds != nil &&
		fmt.Sprint(*up.StabilizationWindowSeconds, up.Policies) != fmt.Sprint(*down.StabilizationWindowSeconds, down.Policies) {
		t.Errorf("%s: scaleUp %+v and scaleDown %+v differ in window or policies", what, b.ScaleUp, b.ScaleDown)
	}
}

// TestAutoscalingTargetsTheSamples: each sample Deployment has exactly one HPA and one
// ScaledObject, each on the recommended count of the Deployment's own model and role, with a
// target that makes the count the replicas (AverageValue 1).
func TestAutoscalingTargetsTheSamples(t *testing.T) {
	samples := sampleTargets(t)
	if len(samples) != 3 {
		t.Fatalf("samples/pd-vllm has %d Deployments, want 3", len(samples))
	}

	seen := map[string]bool{}
	for _, h := range hpas(t) {
		what := "HPA " + h.Name
		target, ok := checkTarget(t, what, h.Spec.ScaleTargetRef, samples, seen)
		if !ok {
			continue
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			t.Errorf("%s: replicas %v..%d", what, h.Spec.MinReplicas, h.Spec.MaxReplicas)
		}
		if len(h.Spec.Metrics) != 1 || h.Spec.Metrics[0].Type != autoscalingv2.ExternalMetricSourceType || h.Spec.Metrics[0].External == nil {
			t.Errorf("%s: metrics %+v, want one External metric", what, h.Spec.Metrics)
			continue
		}
		ext := h.Spec.Metrics[0].External
		want := map[string]string{"model": target.model, "role": target.role}
		if ext.Metric.Name != recommendedPods || ext.Metric.Selector == nil || len(ext.Metric.Selector.MatchExpressions) != 0 ||
			fmt.Sprint(ext.Metric.Selector.MatchLabels) != fmt.Sprint(want) {
			t.Errorf("%s: metric %s selector %v, want %s selecting exactly %v", what, ext.Metric.Name, ext.Metric.Selector, recommendedPods, want)
		}
		if ext.Target.Type != autoscalingv2.AverageValueMetricType || ext.Target.AverageValue == nil || ext.Target.AverageValue.MilliValue() != 1000 {
			t.Errorf("%s: target %+v, want AverageValue 1 (desired replicas = ceil(recommended / 1))", what, ext.Target)
		}
		checkBehavior(t, what, h.Spec.Behavior)
	}
	if len(seen) != len(samples) {
		t.Errorf("HPAs scale %v, want every sample Deployment %v", seen, samples)
	}

	seen = map[string]bool{}
	for _, so := range scaledObjects(t) {
		what := "ScaledObject " + so.Metadata.Name
		target, ok := checkTarget(t, what, so.Spec.ScaleTargetRef, samples, seen)
		if !ok {
			continue
		}
		if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount < 1 || so.Spec.MaxReplicaCount == nil || *so.Spec.MaxReplicaCount < *so.Spec.MinReplicaCount {
			t.Errorf("%s: replicas %v..%v", what, so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount)
		}
		checkBehavior(t, what, so.Spec.Advanced.HorizontalPodAutoscalerConfig.Behavior)
		if len(so.Spec.Triggers) != 1 {
			t.Errorf("%s: %d triggers, want 1", what, len(so.Spec.Triggers))
			continue
		}
		tr := so.Spec.Triggers[0]
		if tr.Type != "prometheus" || tr.MetricType != "AverageValue" {
			t.Errorf("%s: trigger %s metricType %q, want prometheus with AverageValue", what, tr.Type, tr.MetricType)
		}
		// Names KEDA v2.20's prometheus scaler reads (pkg/scalers/prometheus_scaler.go); the CRD
		// takes any string map here, so a misspelt key would be dropped silently.
		if keys := slices.Sorted(maps.Keys(tr.Metadata)); fmt.Sprint(keys) != "[ignoreNullValues query serverAddress threshold]" {
			t.Errorf("%s: metadata keys %v", what, keys)
		}
		if v, err := strconv.ParseFloat(tr.Metadata["threshold"], 64); err != nil || v != 1 {
			t.Errorf("%s: threshold %q, want 1 (desired replicas = ceil(recommended / 1))", what, tr.Metadata["threshold"])
		}
		if tr.Metadata["ignoreNullValues"] != "false" {
			t.Errorf("%s: ignoreNullValues %q, want \"false\" (an empty answer must hold the replicas, not read as 0)", what, tr.Metadata["ignoreNullValues"])
		}
		checkQuery(t, what, tr.Metadata["query"], kedaNamespace, target)
	}
	if len(seen) != len(samples) {
		t.Errorf("ScaledObjects scale %v, want every sample Deployment %v", seen, samples)
	}
}

var (
	advisorSelectorRE = regexp.MustCompile(`\b(` + recommendedPods + `|` + adviceConfidence + `)\{([^}]*)\}`)
	matcherRE         = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"([^"]*)"\s*$`)
)

// checkQuery checks a PromQL query folds the recommended count of one model and role in one
// namespace into one value, gated on the same model's confidence there.
func checkQuery(t *testing.T, what, query, namespace string, target roleTarget) {
	t.Helper()
	if !strings.HasPrefix(query, "max("+recommendedPods+"{") {
		t.Errorf("%s: query %q does not start with max(%s{...}): the autoscaler needs one value", what, query, recommendedPods)
	}
	want := []string{
		fmt.Sprintf("%s map[model:%s namespace:%s]", adviceConfidence, target.model, namespace),
		fmt.Sprintf("%s map[model:%s namespace:%s role:%s]", recommendedPods, target.model, namespace, target.role),
	}
	var got []string
	for _, sel := range advisorSelectorRE.FindAllStringSubmatch(query, -1) {
		matchers := map[string]string{}
		for _, m := range strings.Split(sel[2], ",") {
			p := matcherRE.FindStringSubmatch(m)
			if p == nil || p[2] != "=" {
				t.Errorf("%s: matcher %q in %s, want label=\"value\"", what, m, sel[0])
				continue
			}
			matchers[p[1]] = p[3]
		}
		got = append(got, fmt.Sprint(sel[1], " ", matchers))
	}
	if slices.Sort(got); !slices.Equal(got, want) {
		t.Errorf("%s: query %q\nselects %q\nwant    %q", what, query, got, want)
	}
}

// adapterRule reads autoscaling/prometheus-adapter's rule as the adapter does: its own config
// package, which rejects unknown fields.
func adapterRule(t *testing.T) adapterconfig.DiscoveryRule {
	t.Helper()
	file, err := os.ReadFile(filepath.Join(adapterDir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm *corev1.ConfigMap
	for _, o := range render(t, adapterDir) {
		cm = typed[corev1.ConfigMap](t, []*unstructured.Unstructured{o}, "ConfigMap", "tandem-prometheus-adapter")
	}
	if cm == nil || cm.Data["config.yaml"] != string(file) || len(cm.Data) != 1 {
		t.Fatalf("the ConfigMap does not hold config.yaml alone under the key the adapter's --config names")
	}
	cfg, err := adapterconfig.FromYAML(file)
	if err != nil {
		t.Fatalf("prometheus-adapter rejects %s: %v", adapterDir, err)
	}
	if len(cfg.Rules) != 0 || cfg.ResourceRules != nil || len(cfg.ExternalRules) != 1 {
		t.Fatalf("config has %d rules, resource rules %v and %d external rules; want one external rule alone", len(cfg.Rules), cfg.ResourceRules, len(cfg.ExternalRules))
	}
	return cfg.ExternalRules[0]
}

// adapterQuery is the PromQL Prometheus Adapter v0.12 sends for an HPA's External metric: the
// rule's metricsQuery template (delimiters << >>) run on the series, the selector's matchers in
// key order and then, the rule being namespaced, the HPA's namespace (pkg/naming's BuildExternal,
// where GroupBy is empty for external rules). missingkey=error is stricter than the adapter,
// which would write "<no value>" into the query.
func adapterQuery(t *testing.T, rule adapterconfig.DiscoveryRule, series, namespace string, selector map[string]string) string {
	t.Helper()
	tmpl, err := template.New("metrics-query").Delims("<<", ">>").Option("missingkey=error").Parse(rule.MetricsQuery)
	if err != nil {
		t.Fatalf("metricsQuery: %v", err)
	}
	var matchers []string
	values := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(selector)) {
		matchers = append(matchers, fmt.Sprintf("%s=%q", k, selector[k]))
		values[k] = selector[k]
	}
	matchers = append(matchers, fmt.Sprintf("namespace=%q", namespace))
	values["namespace"] = namespace
	var b strings.Builder
	err = tmpl.Execute(&b, struct {
		Series            string
		LabelMatchers     string
		LabelValuesByName map[string]string
		GroupBy           string
		GroupBySlice      []string
	}{Series: series, LabelMatchers: strings.Join(matchers, ","), LabelValuesByName: values})
	if err != nil {
		t.Fatalf("metricsQuery on %s %v: %v", series, selector, err)
	}
	return b.String()
}

// TestAutoscalingAdapterRule: the rule loads with the adapter's own strict loader (and a
// misspelt key does not), names the metric the HPAs ask for, maps the namespace label, and
// becomes for each HPA a query on that HPA's model and role.
func TestAutoscalingAdapterRule(t *testing.T) {
	rule := adapterRule(t)
	if !strings.HasPrefix(rule.SeriesQuery, recommendedPods+"{") {
		t.Errorf("seriesQuery %q does not list %s", rule.SeriesQuery, recommendedPods)
	}
	re, err := regexp.Compile(rule.Name.Matches)
	if err != nil || !re.MatchString(recommendedPods) || re.ReplaceAllString(recommendedPods, rule.Name.As) != recommendedPods {
		t.Errorf("name %+v does not serve %s under its own name (err %v)", rule.Name, recommendedPods, err)
	}
	if ns, ok := rule.Resources.Overrides["namespace"]; !ok || ns.Resource != "namespace" || ns.Group != "" ||
		(rule.Resources.Namespaced != nil && !*rule.Resources.Namespaced) {
		t.Errorf("resources %+v: want the label namespace mapped to namespaces, and the rule namespaced", rule.Resources)
	}

	raw, err := os.ReadFile(filepath.Join(adapterDir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	misspelt := bytes.Replace(raw, []byte("  metricsQuery:"), []byte("  metricQuery:"), 1)
	if bytes.Equal(misspelt, raw) {
		t.Fatal("no metricsQuery key to misspell")
	}
	if _, err := adapterconfig.FromYAML(misspelt); err == nil || !strings.Contains(err.Error(), "metricQuery") {
		t.Errorf("the adapter's loader accepted a misspelt key (err %v): the check above is not strict", err)
	}

	samples := sampleTargets(t)
	for _, h := range hpas(t) {
		ext := h.Spec.Metrics[0].External
		q := adapterQuery(t, rule, ext.Metric.Name, "llm", ext.Metric.Selector.MatchLabels)
		checkQuery(t, "the adapter's query for HPA "+h.Name, q, "llm", samples[h.Spec.ScaleTargetRef.Name])
	}
}

// promExprTest is one promql_expr_test of a promtool rule unit-test file.
type promExprTest struct {
	Expr       string       `json:"expr"`
	EvalTime   string       `json:"eval_time"`
	ExpSamples []promSample `json:"exp_samples"`
}

type promSample struct {
	Labels string  `json:"labels"`
	Value  float64 `json:"value"`
}

// TestAutoscalingQueriesWithPromtool runs every query an autoscaler would send (the adapter's,
// built from its rule for each HPA, and each ScaledObject's) through promtool against two EPP
// replicas' gauges in namespace llm, with other models and another namespace around. Worked by
// hand: for my-model in llm the replicas report prefill 3 and 2, decode 4 and 5, standard 1 and
// 1, so max gives 3, 5 and 1 (other-model's 7 and staging's 9 are not selected). Confidence is
// 0.8 and 0.7 for the first 10 minutes (max 0.8 >= 0.5: the count), then 0.2 and 0.3 (max 0.3:
// no answer, so the autoscaler holds), while staging's 0.9 must not count.
func TestAutoscalingQueriesWithPromtool(t *testing.T) {
	series := map[string]string{
		`tandem_recommended_pods{namespace="llm",pod="epp-a",model="my-model",role="prefill"}`:      "3x20",
		`tandem_recommended_pods{namespace="llm",pod="epp-b",model="my-model",role="prefill"}`:      "2x20",
		`tandem_recommended_pods{namespace="llm",pod="epp-a",model="my-model",role="decode"}`:       "4x20",
		`tandem_recommended_pods{namespace="llm",pod="epp-b",model="my-model",role="decode"}`:       "5x20",
		`tandem_recommended_pods{namespace="llm",pod="epp-a",model="my-model",role="standard"}`:     "1x20",
		`tandem_recommended_pods{namespace="llm",pod="epp-b",model="my-model",role="standard"}`:     "1x20",
		`tandem_recommended_pods{namespace="llm",pod="epp-a",model="other-model",role="prefill"}`:   "7x20",
		`tandem_recommended_pods{namespace="staging",pod="epp-c",model="my-model",role="prefill"}`:  "9x20",
		`tandem_recommended_pods{namespace="staging",pod="epp-c",model="my-model",role="decode"}`:   "9x20",
		`tandem_recommended_pods{namespace="staging",pod="epp-c",model="my-model",role="standard"}`: "9x20",
		`tandem_advice_confidence{namespace="llm",pod="epp-a",model="my-model"}`:                    "0.8x9 0.2x10",
		`tandem_advice_confidence{namespace="llm",pod="epp-b",model="my-model"}`:                    "0.7x9 0.3x10",
		`tandem_advice_confidence{namespace="llm",pod="epp-a",model="other-model"}`:                 "0.9x20",
		`tandem_advice_confidence{namespace="staging",pod="epp-c",model="my-model"}`:                "0.9x20",
	}
	want := map[string]float64{"prefill": 3, "decode": 5, "standard": 1}

	samples := sampleTargets(t)
	type sent struct{ by, deployment, query string }
	var queries []sent
	rule := adapterRule(t)
	for _, h := range hpas(t) {
		ext := h.Spec.Metrics[0].External
		queries = append(queries, sent{"the adapter for HPA " + h.Name, h.Spec.ScaleTargetRef.Name,
			adapterQuery(t, rule, ext.Metric.Name, "llm", ext.Metric.Selector.MatchLabels)})
	}
	for _, so := range scaledObjects(t) {
		queries = append(queries, sent{"ScaledObject " + so.Metadata.Name, so.Spec.ScaleTargetRef.Name, so.Spec.Triggers[0].Metadata["query"]})
	}
	if len(queries) != 6 {
		t.Fatalf("%d queries, want 3 from the adapter and 3 from KEDA", len(queries))
	}

	var tests []promExprTest
	for _, q := range queries {
		v, ok := want[samples[q.deployment].role]
		if !ok {
			t.Fatalf("%s: no expected value for Deployment %s", q.by, q.deployment)
		}
		tests = append(tests,
			promExprTest{Expr: q.query, EvalTime: "5m", ExpSamples: []promSample{{Labels: "{}", Value: v}}},
			promExprTest{Expr: q.query, EvalTime: "15m", ExpSamples: []promSample{}})
	}
	var input []map[string]string
	for _, s := range slices.Sorted(maps.Keys(series)) {
		input = append(input, map[string]string{"series": s, "values": series[s]})
	}
	file := map[string]any{
		"evaluation_interval": "1m",
		"tests":               []any{map[string]any{"interval": "1m", "input_series": input, "promql_expr_test": tests}},
	}
	raw, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	out, err := yaml.JSONToYAML(raw)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "autoscaling-test.yaml"), out, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtoolPath(t), "test", "rules", "autoscaling-test.yaml")
	cmd.Dir = dir
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		t.Errorf("promtool test rules: %v\n%s\n%s", err, log.String(), out)
	}
}

// TestAutoscalingApply creates the sample Deployments and then each autoscaling flavour, in a
// namespace of its own (one cluster uses one), on a real kube-apiserver with KEDA's ScaledObject
// CRD installed, with server-side field validation Strict: the server's schemas (built-in for the
// HPA, KEDA's CRD with its CEL rule for the ScaledObject) check every field. Broken copies, one
// misspelt field and one invalid value for each kind, must be refused, so the check is real.
func TestAutoscalingApply(t *testing.T) {
	env := k8stest.Start(t, k8stest.WithCRDs(kedaCRDs))
	ctx := context.Background()
	strict := client.FieldValidation("Strict")
	create := func(o *unstructured.Unstructured, ns string) error {
		o = o.DeepCopy()
		o.SetNamespace(ns)
		return env.Client.Create(ctx, o, strict)
	}
	samples := render(t, "samples/pd-vllm")
	created := map[string]*unstructured.Unstructured{}
	for _, dir := range []string{hpaDir, kedaDir} {
		ns := env.Namespace(t, filepath.Base(dir))
		for _, o := range append(slices.Clone(samples), render(t, dir)...) {
			if err := create(o, ns); err != nil {
				t.Fatalf("%s: create %s %s: %v", dir, o.GetKind(), o.GetName(), err)
			}
			created[o.GetKind()+"/"+o.GetName()] = o
		}
		// The tolerance field is behind the HPAConfigurableTolerance gate (beta, on by default
		// since Kubernetes 1.34); a server without it drops the field, and the default 10 % applies.
		stored := render(t, dir)[0] // read back from the server below
		path := []string{"spec", "behavior", "scaleDown", "tolerance"}
		if dir == kedaDir {
			path = append([]string{"spec", "advanced", "horizontalPodAutoscalerConfig"}, path[1:]...)
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: stored.GetName()}, stored); err != nil {
			t.Fatalf("get %s %s: %v", stored.GetKind(), stored.GetName(), err)
		}
		if v, found, _ := unstructured.NestedFieldNoCopy(stored.Object, path...); !found || fmt.Sprint(v) != "0" {
			t.Errorf("%s %s as stored: %s = %v (found %v), want 0", stored.GetKind(), stored.GetName(), strings.Join(path, "."), v, found)
		}
	}

	ns := env.Namespace(t, "broken")
	broken := []struct {
		what, from string
		edit       func(o map[string]any)
		refusal    string
	}{
		{"an HPA target with a misspelt averageValue", "HorizontalPodAutoscaler/my-model-prefill-group-0", func(o map[string]any) {
			target := o["spec"].(map[string]any)["metrics"].([]any)[0].(map[string]any)["external"].(map[string]any)["target"].(map[string]any)
			target["averageValues"] = target["averageValue"]
			delete(target, "averageValue")
		}, `unknown field "spec.metrics[0].external.target.averageValues"`},
		{"an HPA with maxReplicas below minReplicas", "HorizontalPodAutoscaler/my-model-prefill-group-0", func(o map[string]any) {
			o["spec"].(map[string]any)["maxReplicas"] = int64(0)
		}, "spec.maxReplicas"},
		{"a ScaledObject trigger with a misspelt metricType", "ScaledObject/my-model-prefill-group-0", func(o map[string]any) {
			trigger := o["spec"].(map[string]any)["triggers"].([]any)[0].(map[string]any)
			trigger["metricsType"] = trigger["metricType"]
			delete(trigger, "metricType")
		}, `unknown field "spec.triggers[0].metricsType"`},
		{"a ScaledObject with minReplicaCount above maxReplicaCount", "ScaledObject/my-model-prefill-group-0", func(o map[string]any) {
			o["spec"].(map[string]any)["minReplicaCount"] = int64(9)
		}, "minReplicaCount must be less than or equal to maxReplicaCount"},
	}
	for i, b := range broken {
		o := created[b.from].DeepCopy()
		b.edit(o.Object)
		o.SetName(fmt.Sprintf("broken-%d", i))
		if err := create(o, ns); err == nil || !strings.Contains(err.Error(), b.refusal) {
			t.Errorf("%s: err %v, want a refusal naming %q", b.what, err, b.refusal)
		}
	}
}
