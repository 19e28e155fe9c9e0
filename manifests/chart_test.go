package manifests_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/app/apptest"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/extproc"
)

const chartDir = "../charts/tandem"

// update rewrites the chart's generated settings block and schema from internal/config.
var update = flag.Bool("update", false, "rewrite charts/tandem's settings in values.yaml and values.schema.json from internal/config")

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helm returns the Helm binary: $TANDEM_HELM (hack/test.sh exports it) or what
// hack/ensure-helm.sh builds from the Go module proxy.
func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		if helmPath = os.Getenv("TANDEM_HELM"); helmPath != "" {
			return
		}
		cmd := exec.Command(filepath.Join("..", "hack", "ensure-helm.sh"))
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			helmErr = fmt.Errorf("hack/ensure-helm.sh: %w", err)
		}
		helmPath = strings.TrimSpace(string(out))
	})
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmPath
}

// runHelm runs helm with args and returns stdout, or the error with stderr.
// The chart has no default image tag (none is published): template and lint get the tag the
// kustomize base names, which a test's own --set image.tag=… overrides (the last --set wins).
func runHelm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	if len(args) > 0 && (args[0] == "template" || args[0] == "lint") {
		args = append([]string{args[0], "--set", "image.tag=latest"}, args[1:]...)
	}
	cmd := exec.Command(helm(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// helmTemplate renders the chart as release tandem with the extra helm arguments.
func helmTemplate(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := runHelm(t, append([]string{"template", "tandem", chartDir, "--namespace", "llm"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeDocs(t, out)
}

func decodeDocs(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decoding helm's output: %v", err)
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		// As kustomize's objects are decoded (integers stay integers), so the two compare.
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			t.Fatalf("decoding helm's output: %v\n%s", err, raw)
		}
		objs = append(objs, u)
	}
}

// presets are the chart's provider presets and the kustomize directory each must match.
var presets = []struct {
	provider, dir string
	args          []string
}{
	{"none", "base", nil},
	{"envoy-gateway", "overlays/envoy-gateway", []string{"--set", "provider.name=envoy-gateway", "--set", "gateway.create=true"}},
	{"kgateway", "overlays/kgateway", []string{"--set", "provider.name=kgateway", "--set", "gateway.create=true"}},
	{"istio", "overlays/istio", []string{"--set", "provider.name=istio", "--set", "gateway.create=true"}},
	{"nginx-gateway-fabric", "overlays/nginx-gateway-fabric", []string{"--set", "provider.name=nginx-gateway-fabric", "--set", "gateway.create=true"}},
}

// monitoringArgs turns on everything manifests/monitoring has.
var monitoringArgs = []string{"--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.dashboard.enabled=true"}

func TestChartLint(t *testing.T) {
	for _, p := range presets {
		t.Run(p.provider, func(t *testing.T) {
			if out, err := runHelm(t, append([]string{"lint", "--strict", chartDir}, p.args...)...); err != nil {
				t.Errorf("%v\n%s", err, out)
			}
		})
	}
	t.Run("everything on", func(t *testing.T) {
		if out, err := runHelm(t, append(append([]string{"lint", "--strict", chartDir, "-f", "testdata/chart-values-full.yaml"}, monitoringArgs...), presets[3].args...)...); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	})
}

// normalized is an object as the comparison sees it: labels, annotations, namespaces and the
// EPP's own label selectors differ by design (the chart adds instance labels), nothing else may.
func normalized(o *unstructured.Unstructured) map[string]any {
	c := o.DeepCopy().Object
	md := c["metadata"].(map[string]any)
	delete(md, "labels")
	delete(md, "annotations")
	delete(md, "namespace")
	if spec, ok := c["spec"].(map[string]any); ok {
		switch o.GetKind() {
		case "Deployment":
			delete(spec, "selector")
			delete(spec["template"].(map[string]any), "metadata")
		case "Service", "ServiceMonitor":
			delete(spec, "selector")
		}
	}
	return c
}

func byKindName(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		m[o.GetKind()+"/"+o.GetName()] = o
	}
	return m
}

// TestChartMatchesKustomize: for every provider preset, the chart renders the same objects as
// the kustomize directory, field by field (args, env names, ports, probes, security, RBAC, pool,
// route, gateway and vendor resources); with monitoring on, it adds exactly manifests/monitoring.
func TestChartMatchesKustomize(t *testing.T) {
	for _, p := range presets {
		t.Run(p.provider, func(t *testing.T) {
			compareRenders(t, byKindName(helmTemplate(t, p.args...)), byKindName(render(t, p.dir)))
		})
	}
	t.Run("monitoring", func(t *testing.T) {
		chart := byKindName(helmTemplate(t, monitoringArgs...))
		for k := range byKindName(render(t, "base")) {
			delete(chart, k)
		}
		compareRenders(t, chart, byKindName(render(t, "monitoring")))
	})
}

func compareRenders(t *testing.T, chart, kust map[string]*unstructured.Unstructured) {
	t.Helper()
	if got, want := slices.Sorted(maps.Keys(chart)), slices.Sorted(maps.Keys(kust)); !slices.Equal(got, want) {
		t.Fatalf("chart renders %v, kustomize %v", got, want)
	}
	for k, c := range chart {
		a, b := normalized(c), normalized(kust[k])
		if !reflect.DeepEqual(a, b) {
			ja, _ := yaml.Marshal(a)
			jb, _ := yaml.Marshal(b)
			t.Errorf("%s differs between the chart and kustomize:\n--- chart\n%s\n--- kustomize\n%s", k, ja, jb)
		}
	}
}

// TestChartFitsTogether runs the base's consistency checks on the chart's rendering.
func TestChartFitsTogether(t *testing.T) {
	checkFitsTogether(t, helmTemplate(t))
}

// ruleBounds are the JSON schema bounds of internal/config's numeric rules (by their wording);
// TestChartRejectsSettingsTandemRejects checks them against Tandem's own validation.
var ruleBounds = map[string]map[string]any{
	"must be positive":                 {"exclusiveMinimum": 0},
	"must be 0 or more":                {"minimum": 0},
	"must be 0 (disabled) or positive": {"minimum": 0},
	"must be 0 to 1":                   {"minimum": 0, "maximum": 1},
	"must be 0 to 100":                 {"minimum": 0, "maximum": 100},
	"must be in [0, 1024)":             {"minimum": 0, "exclusiveMaximum": 1024},
}

// rulePatterns are the same bounds for a number given as a decimal string, as `helm --set
// settings.hybridCacheLoadFactor=0.5` gives it (Helm's --set parses integers and booleans, not
// fractions); Tandem reads the string as it reads the number.
var rulePatterns = map[string]string{
	"must be positive":  `^([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)$`,
	"must be 0 or more": `^([0-9]+(\.[0-9]*)?|\.[0-9]+)$`,
	"must be 0 to 1":    `^(0+(\.[0-9]*)?|0*\.[0-9]+|0*1(\.0*)?)$`,
	"must be 0 to 100":  `^(0*[0-9]{1,2}(\.[0-9]*)?|0*\.[0-9]+|0*100(\.0*)?)$`,
}

// settingsSchema is the JSON schema of one setting, from its definition in internal/config.
func settingsSchema() map[string]any {
	props := map[string]any{}
	for i := range config.Vars {
		v := &config.Vars[i]
		s := map[string]any{"description": fmt.Sprintf("%s (default %q). %s", v.Name, v.Default(), v.Description)}
		switch {
		case strings.HasPrefix(v.Type, "one of ") && v.AnyCase:
			// Matched in any case: the values as written (an error lists them), or each as a
			// pattern of its letters in either case.
			var enum []any
			var alts []string
			for _, o := range strings.Split(strings.TrimPrefix(v.Type, "one of "), ", ") {
				enum = append(enum, o)
				alts = append(alts, anyCasePattern(o))
			}
			s["anyOf"] = []any{
				map[string]any{"enum": append(enum, nil)},
				map[string]any{"type": "string", "pattern": "^(" + strings.Join(alts, "|") + ")$"},
			}
		case strings.HasPrefix(v.Type, "one of "):
			var enum []any
			for _, o := range strings.Split(strings.TrimPrefix(v.Type, "one of "), ", ") {
				enum = append(enum, o)
			}
			s["enum"] = append(enum, nil)
		case v.Type == "boolean":
			s["type"] = []any{"boolean", "null"}
		case v.Type == "number":
			pattern, ok := rulePatterns[v.Rule]
			if !ok {
				panic(fmt.Sprintf("%s: no string pattern for the rule %q; add it to rulePatterns", v.Name, v.Rule))
			}
			// minimum and maximum bind numbers, pattern binds strings (JSON schema applies each
			// keyword to its own type).
			s["type"] = []any{"number", "string", "null"}
			s["pattern"] = pattern
		case v.Type == "integer" || v.Type == "seconds" || v.Type == "minutes" || v.Type == "milliseconds":
			s["type"] = []any{"integer", "null"}
		default:
			s["type"] = []any{"string", "null"}
		}
		if s["type"] != nil && (s["type"].([]any)[0] == "number" || s["type"].([]any)[0] == "integer") {
			b, ok := ruleBounds[v.Rule]
			if !ok {
				panic(fmt.Sprintf("%s: no schema bounds for the rule %q; add them to ruleBounds", v.Name, v.Rule))
			}
			maps.Copy(s, b)
		}
		props[v.Key] = s
	}
	return map[string]any{"type": "object", "additionalProperties": false, "properties": props,
		"description": "Gateway settings by their config-file key (docs/configuration.md); null keeps Tandem's default."}
}

// anyCasePattern is a JSON schema (ECMA 262) pattern matching word in any case: [lL] for
// each letter, the rest escaped.
func anyCasePattern(word string) string {
	var b strings.Builder
	for _, r := range word {
		switch {
		case unicode.IsLetter(r):
			fmt.Fprintf(&b, "[%c%c]", unicode.ToLower(r), unicode.ToUpper(r))
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	return b.String()
}

// settingsBlock is values.yaml's settings section.
func settingsBlock() string {
	var b strings.Builder
	b.WriteString("# settings:start (generated from internal/config: go test ./manifests/ -run TestChartSettings -update)\nsettings:\n")
	for i := range config.Vars {
		v := &config.Vars[i]
		d := v.Default()
		if d == "" {
			d = "unset"
		}
		fmt.Fprintf(&b, "  # %s, default %s: %s\n  %s: null\n", v.Name, d, strings.ReplaceAll(v.Description, "\n", " "), v.Key)
	}
	b.WriteString("# settings:end\n")
	return b.String()
}

var settingsBlockRE = regexp.MustCompile(`(?s)# settings:start.*?# settings:end\n`)

// TestChartSettingsMatchConfig: values.yaml lists every gateway setting (with its variable and
// default) and values.schema.json types each one, as internal/config defines them; a setting
// added there fails here until `go test ./manifests/ -run TestChartSettings -update` is run.
func TestChartSettingsMatchConfig(t *testing.T) {
	valuesPath, schemaPath := filepath.Join(chartDir, "values.yaml"), filepath.Join(chartDir, "values.schema.json")
	values, err := os.ReadFile(valuesPath)
	if err != nil {
		t.Fatal(err)
	}
	rawSchema, err := os.ReadFile(schemaPath)
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(rawSchema, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	wantValues := settingsBlockRE.ReplaceAllLiteralString(string(values), settingsBlock())
	props := schema["properties"].(map[string]any)
	props["settings"] = settingsSchema()
	wantSchema, err := json.MarshalIndent(schema, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	wantSchema = append(wantSchema, '\n')
	if *update {
		if err := os.WriteFile(valuesPath, []byte(wantValues), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(schemaPath, wantSchema, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !settingsBlockRE.Match(values) || wantValues != string(values) {
		t.Errorf("charts/tandem/values.yaml's settings are not internal/config's; run go test ./manifests/ -run TestChartSettings -update")
	}
	if !bytes.Equal(wantSchema, rawSchema) {
		t.Errorf("charts/tandem/values.schema.json is not up to date; run go test ./manifests/ -run TestChartSettings -update")
	}
}

// nonDefault finds, with Tandem's own validation, a valid value other than the default for v.
func nonDefault(t *testing.T, v *config.Var) (string, any) {
	t.Helper()
	var candidates []string
	switch {
	case strings.HasPrefix(v.Type, "one of "):
		candidates = strings.Split(strings.TrimPrefix(v.Type, "one of "), ", ")
	case v.Type == "strategy name": // checked against the strategy registry at start, not by FromEnv
		candidates = []string{"random", "pd"}
	case strings.HasPrefix(v.Type, "list of "):
		candidates = []string{"sglang,vllm", "vllm"}
	default:
		candidates = []string{"true", "false", "7", "42", "0.25", "2", "1", "250", "600000"}
	}
	for _, c := range candidates {
		if c == v.Default() {
			continue
		}
		env := map[string]string{"AIBRIX_PROMPT_LENGTH_BUCKETING": "true", v.Name: c}
		g, warns, err := config.FromEnv(func(k string) string { return env[k] })
		if err != nil || len(warns) > 0 || v.Value(&g) != c {
			continue
		}
		var typed any = c
		if err := yaml.Unmarshal([]byte(c), &typed); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(v.Type, "one of ") || strings.HasPrefix(v.Type, "list of ") || v.Type == "strategy name" {
			typed = c
		}
		return c, typed
	}
	t.Fatalf("%s: found no valid non-default value", v.Name)
	return "", nil
}

// TestChartSettingsReachTandem sets every setting to a non-default value through the chart and
// loads the config file it renders with Tandem's own loader: each value arrives unchanged.
func TestChartSettingsReachTandem(t *testing.T) {
	settings := map[string]any{}
	want := map[string]string{}
	for i := range config.Vars {
		v := &config.Vars[i]
		raw, typed := nonDefault(t, v)
		settings[v.Key] = typed
		want[v.Name] = raw
	}
	js, err := json.Marshal(settings)
	if err != nil {
		t.Fatal(err)
	}
	objs := helmTemplate(t, "--set-json", "settings="+string(js), "--set", "config.plugins[0].type=least-request-scorer")
	cm := typed[corev1.ConfigMap](t, objs, "ConfigMap", "tandem-epp-config")
	dep := typed[appsv1.Deployment](t, objs, "Deployment", "tandem-epp")
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(cm.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := config.LoadFile(file, config.FileOptions{})
	if err != nil {
		t.Fatalf("Tandem rejects the chart's config file:\n%s\n%v", cm.Data["config.yaml"], err)
	}
	g, _, err := config.Load(f, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	for i := range config.Vars {
		v := &config.Vars[i]
		if got := v.Value(&g); got != want[v.Name] {
			t.Errorf("settings.%s=%s reaches Tandem as %s=%q", v.Key, want[v.Name], v.Name, got)
		}
	}
	if len(f.Plugins) != 1 || f.Plugins[0].Type != "least-request-scorer" {
		t.Errorf("config.plugins did not reach the config file: %+v", f.Plugins)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	opts := parseArgs(t, c.Args)
	if opts.ConfigFile != "/etc/tandem/config/config.yaml" || len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/etc/tandem/config" ||
		dep.Spec.Template.Spec.Volumes[0].ConfigMap == nil || dep.Spec.Template.Spec.Volumes[0].ConfigMap.Name != cm.Name {
		t.Errorf("--config-file %q, mounts %+v, volumes %+v: the ConfigMap is not what the EPP reads", opts.ConfigFile, c.VolumeMounts, dep.Spec.Template.Spec.Volumes)
	}
	if dep.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config annotation: a settings change would not roll the pods")
	}
	// And the real Tandem starts with it (plugins built, every setting applied).
	apptest.Start(t, apptest.Options{Args: []string{"--config-file=" + file, "--endpoints-file=" + filepath.Join("..", "examples", "pool.yaml"), "--secure-serving=false"}})
}

// startWithChartConfig starts a real Tandem with the config file and the plain environment
// variables the chart renders for the helm arguments.
func startWithChartConfig(t *testing.T, args ...string) {
	t.Helper()
	objs := helmTemplate(t, args...)
	cm := typed[corev1.ConfigMap](t, objs, "ConfigMap", "tandem-epp-config")
	dep := typed[appsv1.Deployment](t, objs, "Deployment", "tandem-epp")
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(cm.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	apptest.Start(t, apptest.Options{Env: env,
		Args: []string{"--config-file=" + file, "--endpoints-file=" + filepath.Join("..", "examples", "pool.yaml"), "--secure-serving=false"}})
}

func parseArgs(t *testing.T, args []string) *app.Options {
	t.Helper()
	var out []string
	for _, a := range args {
		out = append(out, strings.ReplaceAll(a, "$(NAMESPACE)", "llm"))
	}
	opts, err := app.ParseFlags(out, io.Discard, func(string) string { return "" })
	if err != nil {
		t.Fatalf("the EPP rejects the chart's args %q: %v", args, err)
	}
	return opts
}

// TestChartValuesReachTheEPP: the values for Redis, TLS, logging, replicas, environment and
// the rest arrive as the flags and fields Tandem reads.
func TestChartValuesReachTheEPP(t *testing.T) {
	objs := helmTemplate(t, "-f", "testdata/chart-values-full.yaml")
	dep := typed[appsv1.Deployment](t, objs, "Deployment", "tandem-epp")
	spec := dep.Spec.Template.Spec
	c := spec.Containers[0]
	opts := parseArgs(t, c.Args)
	checks := map[string]bool{
		"pool name":       opts.PoolName == "llama-pool",
		"redis":           opts.RedisAddr == "redis.llm.svc:6379" && opts.RedisTLS && !opts.RedisTLSSkipVerify,
		"cert path":       opts.SecureServing && opts.CertPath == "/etc/tandem/tls",
		"log level":       strings.Contains(strings.Join(c.Args, " "), "--zap-log-level debug"),
		"debug trace":     opts.DebugTraceHeader,
		"max body":        opts.MaxBodyBytes == 20971520,
		"gateway client":  opts.GatewayClient == config.ClientFull,
		"fallbacks":       opts.DestinationFallbacks == config.FallbacksOn, // unquoted YAML on: a boolean
		"hold":            opts.DestinationOnlyHold.String() == "30s",
		"grace":           opts.GracePeriod.String() == "45s",
		"extra args":      opts.HealthChecking,
		"replicas":        dep.Spec.Replicas != nil && *dep.Spec.Replicas == 3,
		"image":           c.Image == "registry.example/team/tandem-epp@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"resources":       c.Resources.Limits.Memory().String() == "2Gi",
		"node selector":   spec.NodeSelector["pool"] == "cpu",
		"termination":     spec.TerminationGracePeriodSeconds != nil && *spec.TerminationGracePeriodSeconds == 60,
		"service account": spec.ServiceAccountName == "tandem-epp",
	}
	for what, ok := range checks {
		if !ok {
			t.Errorf("%s: not as the values say (args %q)", what, c.Args)
		}
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["TANDEM_REDIS_PASSWORD"]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "redis-auth" || e.ValueFrom.SecretKeyRef.Key != "password" {
		t.Errorf("TANDEM_REDIS_PASSWORD = %+v, want it from Secret redis-auth key password", e)
	}
	if env["AIBRIX_PREFILL_REQUEST_TIMEOUT"].Value != "10" || env["GOMEMLIMIT"].ValueFrom == nil {
		t.Errorf("env and extraEnv: %+v", c.Env)
	}
	var tlsVol bool
	for _, v := range spec.Volumes {
		tlsVol = tlsVol || (v.Secret != nil && v.Secret.SecretName == "tandem-epp-tls")
	}
	if !tlsVol {
		t.Errorf("no volume from the TLS Secret: %+v", spec.Volumes)
	}
	startWithChartConfig(t, "-f", "testdata/chart-values-full.yaml")
	ip := byKindName(objs)["InferencePool/llama-pool"]
	if ip == nil {
		t.Fatal("no InferencePool llama-pool")
	}
	ports, _, _ := unstructured.NestedSlice(ip.Object, "spec", "targetPorts")
	if len(ports) != 2 {
		t.Errorf("targetPorts = %v", ports)
	}
}

// TestChartLimitValues: the limits of what clients can make the EPP hold (README, "What one
// client can and cannot do") are values, and they arrive as its flags; a larger maxBodyBytes
// than the body budget, which the EPP refuses at start, fails at helm time instead.
func TestChartLimitValues(t *testing.T) {
	dep := typed[appsv1.Deployment](t, helmTemplate(t, "--set", "maxBodyBytes=314572800", "--set", "maxStreams=512",
		"--set", "maxBufferedBodyBytes=629145600", "--set", "requestBodyTimeout=20s", "--set", "trustClientPDFields=true",
		"--set", "requestHeadersTimeout=3s", "--set", "maxStreamsPerConnection=100", "--set", "grpcKeepaliveMinTime=5s",
		"--set", "grpcKeepaliveTime=30s", "--set", "grpcKeepaliveTimeout=7s", "--set", "grpcMaxConnectionIdle=2m"),
		"Deployment", "tandem-epp")
	opts := parseArgs(t, dep.Spec.Template.Spec.Containers[0].Args)
	if opts.MaxBodyBytes != 314572800 || opts.MaxStreams != 512 || opts.MaxBufferedBodyBytes != 629145600 ||
		opts.RequestBodyTimeout != 20*time.Second || !opts.TrustClientPDFields ||
		opts.RequestHeadersTimeout != 3*time.Second || opts.MaxStreamsPerConnection != 100 || opts.GRPCKeepaliveMinTime != 5*time.Second ||
		opts.GRPCKeepaliveTime != 30*time.Second || opts.GRPCKeepaliveTimeout != 7*time.Second || opts.GRPCMaxConnectionIdle != 2*time.Minute {
		t.Errorf("args %q: the limit values did not arrive", dep.Spec.Template.Spec.Containers[0].Args)
	}
	def := parseArgs(t, typed[appsv1.Deployment](t, helmTemplate(t), "Deployment", "tandem-epp").Spec.Template.Spec.Containers[0].Args)
	if def.MaxStreams != extproc.DefaultMaxStreams || def.MaxBufferedBodyBytes != extproc.DefaultMaxBufferedBodyBytes ||
		def.RequestBodyTimeout != extproc.DefaultRequestBodyTimeout || def.TrustClientPDFields ||
		def.RequestHeadersTimeout != extproc.DefaultRequestHeadersTimeout || def.MaxStreamsPerConnection != 1024 {
		t.Errorf("the defaults render Tandem's own defaults: %+v", def)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "maxBodyBytes=314572800"}, "maxBufferedBodyBytes"},
		{[]string{"--set", "maxStreams=-1"}, "maxStreams"},
		{[]string{"--set", "requestBodyTimeout=soon"}, "requestBodyTimeout"},
		{[]string{"--set", "requestHeadersTimeout=soon"}, "requestHeadersTimeout"},
		{[]string{"--set", "grpcKeepaliveTime=0"}, "grpcKeepaliveTime"},
	} {
		if _, err := runHelm(t, append([]string{"template", "tandem", chartDir}, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want it to name %s", c.args, err, c.want)
		}
	}
}

// TestChartGatewayClientFlags: each preset tells Tandem what its gateway applies of the answer
// (as its overlay does), and an explicit value wins over the preset either way.
func TestChartGatewayClientFlags(t *testing.T) {
	cases := []struct {
		name              string
		args              []string
		client, fallbacks string
	}{
		{"none", nil, config.ClientAuto, config.FallbacksAuto},
		{"envoy-gateway", []string{"--set", "provider.name=envoy-gateway"}, config.ClientAuto, config.FallbacksOff},
		{"kgateway", []string{"--set", "provider.name=kgateway"}, config.ClientAuto, config.FallbacksOff},
		{"istio", []string{"--set", "provider.name=istio"}, config.ClientAuto, config.FallbacksAuto},
		{"nginx-gateway-fabric", []string{"--set", "provider.name=nginx-gateway-fabric"}, config.ClientDestinationOnly, config.FallbacksAuto},
		{"nginx-gateway-fabric, client auto", []string{"--set", "provider.name=nginx-gateway-fabric", "--set", "gatewayClient=auto"}, config.ClientAuto, config.FallbacksAuto},
		{"kgateway, fallbacks on", []string{"--set", "provider.name=kgateway", "--set", "destinationFallbacks=on"}, config.ClientAuto, config.FallbacksOn},
		{"fallbacks false (YAML off)", []string{"--set", "destinationFallbacks=false"}, config.ClientAuto, config.FallbacksOff},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dep := typed[appsv1.Deployment](t, helmTemplate(t, c.args...), "Deployment", "tandem-epp")
			args := dep.Spec.Template.Spec.Containers[0].Args
			opts := parseArgs(t, args)
			if opts.GatewayClient != c.client || opts.DestinationFallbacks != c.fallbacks {
				t.Errorf("args %q: --gateway-client=%s --destination-fallbacks=%s, want %s and %s",
					args, opts.GatewayClient, opts.DestinationFallbacks, c.client, c.fallbacks)
			}
		})
	}
}

// TestChartAIGatewayRouteModel: the envoy-gateway preset's route matches the pool's model label,
// or the model named by provider.envoyGateway.model.
func TestChartAIGatewayRouteModel(t *testing.T) {
	for want, args := range map[string][]string{
		"llama":    {"--set", "provider.name=envoy-gateway", "--set-json", `pool.selector={"model.aibrix.ai/name":"llama"}`},
		"llama-3b": {"--set", "provider.name=envoy-gateway", "--set-json", `pool.selector={"model.aibrix.ai/name":null,"app":"vllm"}`, "--set", "provider.envoyGateway.model=llama-3b"},
	} {
		route := byKindName(helmTemplate(t, args...))["AIGatewayRoute/tandem-route"]
		if route == nil {
			t.Fatalf("%v: no AIGatewayRoute tandem-route", args)
		}
		rules, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
		header := rules[0].(map[string]any)["matches"].([]any)[0].(map[string]any)["headers"].([]any)[0].(map[string]any)
		if header["name"] != "x-ai-eg-model" || header["value"] != want {
			t.Errorf("%v: the route matches %v, want x-ai-eg-model: %s", args, header, want)
		}
	}
}

// TestChartRejectsBadValues: a wrong value fails at helm time with the value named.
func TestChartRejectsBadValues(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--set", "provider.name=nginx"}, "provider"},
		{[]string{"--set", "settings.promptLengthBuckting=true"}, "promptLengthBuckting"},
		{[]string{"--set", "settings.pdHandoff=both"}, "pdHandoff"},
		{[]string{"--set", "settings.decodeScorePolicy=fastest"}, "decodeScorePolicy"},
		{[]string{"--set", "settings.tokenLoadKVWeight=heavy"}, "tokenLoadKVWeight"},
		{[]string{"--set", "tls.secureServing=false", "--set", "tls.certSecretName=x"}, "tls.certSecretName is set but ext_proc is plaintext"},
		{[]string{"--set", "gatewayClient=nginx"}, "gatewayClient"},
		{[]string{"--set", "destinationFallbacks=sometimes"}, "destinationFallbacks"},
		{[]string{"--set", "destinationOnlyHold=15"}, "destinationOnlyHold"},
		{[]string{"--set", "destinationOnlyHold=soon"}, "destinationOnlyHold"},
		{[]string{"--set", "provider.name=envoy-gateway", "--set-json", `pool.selector={"model.aibrix.ai/name":null,"app":"vllm"}`}, "provider.envoyGateway.model"},
		{[]string{"--set", "gateway.create=true"}, "gateway.className"},
		{[]string{"--set", "serviceAccount.create=false"}, "serviceAccount.name"},
		{[]string{"--set", "replicas=two"}, "replicas"},
		{[]string{"--set", "image.tag="}, "image.tag (or image.digest) is required: Tandem publishes no image yet"},
	}
	for _, c := range cases {
		_, err := runHelm(t, append([]string{"template", "tandem", chartDir}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want it to name %q", c.args, err, c.want)
		}
	}
}

// TestChartTakesAnyCaseWhereTandemDoes: a setting Tandem matches in any case, as AIBrix does,
// passes the chart's schema in any case; one matched exactly does not.
func TestChartTakesAnyCaseWhereTandemDoes(t *testing.T) {
	if _, err := runHelm(t, "template", "tandem", chartDir, "--set", "settings.decodeScorePolicy=Load_Balancing"); err != nil {
		t.Errorf("decodeScorePolicy=Load_Balancing (Tandem takes it): %v", err)
	}
	if _, err := runHelm(t, "template", "tandem", chartDir, "--set", "settings.prefillScorePolicy=Least_Request"); err == nil ||
		!strings.Contains(err.Error(), "prefillScorePolicy") {
		t.Errorf("prefillScorePolicy=Least_Request (Tandem refuses it): %v, want the schema to name it", err)
	}
}

// TestChartRejectsSettingsTandemRejects: a setting outside its range (a negative timeout, a
// percentage over 100, a machine ID of 1024) fails at helm time, naming the setting, rather
// than rendering a config file the EPP refuses at start (a crash-looping pod). The values are
// the ones Tandem's own validation refuses, so the schema cannot drift from it.
func TestChartRejectsSettingsTandemRejects(t *testing.T) {
	tried := 0
	for i := range config.Vars {
		v := &config.Vars[i]
		if strings.HasPrefix(v.Type, "one of ") || v.Type == "boolean" || v.Type == "strategy name" {
			continue // enums and booleans: TestChartRejectsBadValues
		}
		for _, bad := range []string{"-1", "0", "101", "1.5", "1024"} {
			env := map[string]string{"AIBRIX_PROMPT_LENGTH_BUCKETING": "true", v.Name: bad}
			if _, _, err := config.FromEnv(func(k string) string { return env[k] }); err == nil {
				continue // Tandem takes it: so must the chart
			}
			tried++
			_, err := runHelm(t, "template", "tandem", chartDir, "--set-json", fmt.Sprintf("settings.%s=%s", v.Key, bad))
			if err == nil || !strings.Contains(err.Error(), v.Key) {
				t.Errorf("settings.%s=%s: Tandem refuses it (%s), but helm template says %v", v.Key, bad, v.Rule, err)
			}
		}
	}
	if tried == 0 {
		t.Fatal("no out-of-range value tried")
	}
}

// TestChartTakesNumbersFromSet: a number setting given with `helm --set` arrives as a string
// (Helm parses only integers and booleans there). The chart takes a decimal string exactly when
// Tandem takes its value, and the string reaches Tandem's config file unchanged.
func TestChartTakesNumbersFromSet(t *testing.T) {
	plainDecimal := regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
	tried, rules := 0, map[string]bool{}
	for i := range config.Vars {
		v := &config.Vars[i]
		if v.Type != "number" || rules[v.Rule] {
			continue // one setting per rule: the schema is the rule's
		}
		rules[v.Rule] = true
		for _, s := range []string{"0.5", "1", "0.0", "1.5", "2.25", "100", "100.5", "-1", "0", ".5", "abc", "1e3", "NaN"} {
			env := map[string]string{"AIBRIX_PROMPT_LENGTH_BUCKETING": "true", v.Name: s}
			_, _, tandemErr := config.FromEnv(func(k string) string { return env[k] })
			out, helmErr := runHelm(t, "template", "tandem", chartDir, "--set", fmt.Sprintf("settings.%s=%s", v.Key, s))
			objs := string(out)
			tried++
			switch {
			case tandemErr != nil && helmErr == nil:
				t.Errorf("--set settings.%s=%s: Tandem refuses it (%v), the chart takes it", v.Key, s, tandemErr)
			case tandemErr == nil && plainDecimal.MatchString(s) && helmErr != nil:
				t.Errorf("--set settings.%s=%s: Tandem takes it, the chart says %v", v.Key, s, helmErr)
			case helmErr == nil:
				carried := regexp.MustCompile(`(?m)^\s+` + v.Key + `: ["']?` + regexp.QuoteMeta(s) + `["']?$`)
				if !carried.MatchString(objs) {
					t.Errorf("--set settings.%s=%s: the rendered config file does not carry it:\n%s", v.Key, s, objs)
				}
			}
		}
	}
	if tried == 0 {
		t.Fatal("no number setting tried")
	}
}

// TestChartReadmeListsEveryValue: charts/tandem/README.md names every value of values.yaml
// (settings.* as a group) and nothing that is not one.
func TestChartReadmeListsEveryValue(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	var want []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		m, ok := v.(map[string]any)
		if !ok || len(m) == 0 || prefix == "settings" || prefix == "env" || strings.HasSuffix(prefix, "labels") ||
			strings.HasSuffix(prefix, "Labels") || strings.HasSuffix(prefix, "annotations") || strings.HasSuffix(prefix, "Annotations") ||
			prefix == "pool.selector" || prefix == "resources" || prefix == "nodeSelector" || prefix == "affinity" {
			want = append(want, prefix)
			return
		}
		for k, e := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			walk(p, e)
		}
	}
	walk("", values)
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "\n## Values\n")
	section, _, _ = strings.Cut(section, "\n## ")
	var got []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-zA-Z.]+)` \\|").FindAllStringSubmatch(section, -1) {
		got = append(got, m[1])
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("charts/tandem/README.md's values table lists\n%v\nvalues.yaml has\n%v", got, want)
	}
}

// TestChartApply creates the chart's objects on a real apiserver (with the InferencePool, Gateway
// API, prometheus-operator and Envoy AI Gateway CRDs) for every preset and with every value on, and
// checks that the chart's ServiceAccount, with only the chart's Role, serves the sample model servers.
func TestChartApply(t *testing.T) {
	env := startEnv(t)
	ns := env.Namespace(t, "chart")
	apply(t, env, ns, helmTemplate(t, monitoringArgs...))
	samples := render(t, "samples/pd-vllm")
	apply(t, env, ns, samples)
	for _, p := range presets[1:] {
		t.Run(p.provider, func(t *testing.T) {
			skipped := apply(t, env, env.Namespace(t, "chart-"+p.provider), helmTemplate(t, p.args...))
			t.Logf("not applied (vendor CRDs not installed): %v", skipped)
		})
	}
	t.Run("everything on", func(t *testing.T) {
		objs := helmTemplate(t, append(append([]string{"-f", "testdata/chart-values-full.yaml"}, monitoringArgs...), presets[3].args...)...)
		skipped := apply(t, env, env.Namespace(t, "chart-full"), objs)
		t.Logf("not applied (vendor CRDs not installed): %v", skipped)
	})
	checkEPPRights(t, env, ns, samples)
}
