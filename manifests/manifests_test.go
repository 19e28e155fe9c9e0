// Package manifests_test renders every kustomization under manifests/ and the Helm chart in
// charts/tandem and applies the objects to a real kube-apiserver with the Gateway API,
// InferencePool and prometheus-operator CRDs installed; the EPP's pool source then runs with the
// ServiceAccount's permissions only. It also checks the monitoring rules with promtool, the
// Dockerfile's build, and that the chart and the kustomize base agree. It has tests only: it
// must not write to manifests/ or charts/ nor grant the EPP anything the manifests do not.
package manifests_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierr "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/pool/kube"
	"github.com/tandem-epp/tandem/internal/serving"
	k8stest "github.com/tandem-epp/tandem/internal/testenv"
)

// kustomizations are the directories this test owns, with the kinds each must render.
var kustomizations = map[string][]string{
	"base":                          {"Deployment", "HTTPRoute", "InferencePool", "Role", "RoleBinding", "Service", "ServiceAccount"},
	"samples/pd-vllm":               {"Deployment", "Deployment", "Deployment"},
	"overlays/envoy-gateway":        {"AIGatewayRoute", "Deployment", "Gateway", "GatewayClass", "InferencePool", "Role", "RoleBinding", "Service", "ServiceAccount"},
	"overlays/nginx-gateway-fabric": {"Deployment", "Gateway", "HTTPRoute", "InferencePool", "Role", "RoleBinding", "Service", "ServiceAccount"},
	"overlays/kgateway":             {"Deployment", "Gateway", "HTTPRoute", "InferencePool", "Role", "RoleBinding", "Service", "ServiceAccount"},
	"overlays/istio":                {"Deployment", "DestinationRule", "Gateway", "HTTPRoute", "InferencePool", "Role", "RoleBinding", "Service", "ServiceAccount"},
	"monitoring":                    {"ConfigMap", "PrometheusRule", "ServiceMonitor"},
	hpaDir:                          {"HorizontalPodAutoscaler", "HorizontalPodAutoscaler", "HorizontalPodAutoscaler"},
	kedaDir:                         {"ScaledObject", "ScaledObject", "ScaledObject"},
	adapterDir:                      {"ConfigMap"},
}

// vendorKinds are gateway implementations' own CRDs, not installed here: rendered and checked, not
// applied. (Envoy AI Gateway's AIGatewayRoute CRD is installed: startEnv.)
var vendorKinds = []string{"DestinationRule"}

func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range m.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			t.Fatalf("%s: %s: %v", dir, r.CurId(), err)
		}
		out = append(out, u)
	}
	return out
}

func TestRender(t *testing.T) {
	for dir, want := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			var kinds []string
			for _, o := range render(t, dir) {
				kinds = append(kinds, o.GetKind())
			}
			sort.Strings(kinds)
			if !slices.Equal(kinds, want) {
				t.Errorf("kinds = %v, want %v", kinds, want)
			}
		})
	}
}

// typed converts a rendered object into its Go type.
func typed[T any](t *testing.T, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			var v T
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &v); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return &v
		}
	}
	t.Fatalf("no %s named %s", kind, name)
	return nil
}

// TestBaseFitsTogether checks what the apiserver cannot: that the pieces name each other right,
// and that the EPP accepts its own arguments.
func TestBaseFitsTogether(t *testing.T) { checkFitsTogether(t, render(t, "base")) }

// checkFitsTogether checks a rendering of the EPP (kustomize base or Helm chart).
func checkFitsTogether(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	dep := typed[appsv1.Deployment](t, objs, "Deployment", "tandem-epp")
	svc := typed[corev1.Service](t, objs, "Service", "tandem-epp")
	role := typed[rbacv1.Role](t, objs, "Role", "tandem-epp")
	binding := typed[rbacv1.RoleBinding](t, objs, "RoleBinding", "tandem-epp")
	ip := typed[infv1.InferencePool](t, objs, "InferencePool", "tandem-pool")
	route := typed[gwv1.HTTPRoute](t, objs, "HTTPRoute", "tandem-route")

	c := dep.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	opts, err := app.ParseFlags(strings.Fields(strings.ReplaceAll(args, "$(NAMESPACE)", "prod")), io.Discard, func(string) string { return "" })
	if err != nil {
		t.Fatalf("the EPP rejects the Deployment's args %q: %v", args, err)
	}
	if opts.PoolName != ip.Name || opts.PoolNamespace != "prod" || opts.GRPCPort != 9002 || opts.GRPCHealthPort != 9003 || opts.MetricsPort != 9090 || !opts.SecureServing {
		t.Errorf("args %q parse to pool %s/%s ports %d/%d/%d secure=%v", args, opts.PoolNamespace, opts.PoolName, opts.GRPCPort, opts.GRPCHealthPort, opts.MetricsPort, opts.SecureServing)
	}
	if c.Image != defaultImage {
		t.Errorf("image = %q, want %s", c.Image, defaultImage)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if fmt.Sprint(ports) != "map[grpc:9002 grpc-health:9003 metrics:9090]" {
		t.Errorf("container ports = %v", ports)
	}
	// The probes ask the Endpoint Picker Protocol's health services (GIE v1.6), which Tandem serves.
	for name, probe := range map[string]*corev1.Probe{serving.LivenessService: c.LivenessProbe, serving.ReadinessService: c.ReadinessProbe} {
		if probe == nil || probe.GRPC == nil || probe.GRPC.Port != 9003 || probe.GRPC.Service == nil || *probe.GRPC.Service != name {
			t.Errorf("%s probe = %+v, want gRPC on 9003 service %q", name, probe, name)
		}
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("container security context = %+v, want a read-only root", sc)
	}
	if ps := dep.Spec.Template.Spec.SecurityContext; ps == nil || ps.RunAsUser == nil || *ps.RunAsUser != 65532 {
		t.Errorf("pod security context = %+v, want user 65532 (the image's nonroot user)", ps)
	}

	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v || dep.Spec.Selector.MatchLabels[k] != v {
			t.Errorf("Service selector %v does not select the Deployment's pods %v", svc.Spec.Selector, dep.Spec.Template.Labels)
		}
	}
	if len(svc.Spec.Selector) == 0 {
		t.Error("the Service selects no pods")
	}
	var grpcPort *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == 9002 {
			grpcPort = &svc.Spec.Ports[i]
		}
	}
	if grpcPort == nil || grpcPort.AppProtocol == nil || *grpcPort.AppProtocol != "http2" {
		t.Errorf("Service port 9002 = %+v, want appProtocol http2", grpcPort)
	}
	ref := ip.Spec.EndpointPickerRef
	if ref == nil || string(ref.Name) != svc.Name || ref.Port == nil || ref.Port.Number != 9002 {
		t.Errorf("InferencePool endpointPickerRef = %+v, want Service %s port 9002", ref, svc.Name)
	}
	b := route.Spec.Rules[0].BackendRefs[0]
	if string(b.Name) != ip.Name || b.Kind == nil || *b.Kind != "InferencePool" || b.Group == nil || *b.Group != "inference.networking.k8s.io" {
		t.Errorf("HTTPRoute backend = %+v, want InferencePool %s", b.BackendObjectReference, ip.Name)
	}

	var rules []string
	for _, r := range role.Rules {
		rules = append(rules, fmt.Sprintf("%v/%v:%v", r.APIGroups, r.Resources, r.Verbs))
	}
	// Read access to pods, pools and InferenceObjectives is all routing needs; the events rule
	// is optional (Warning events on pods with a bad model.aibrix.ai/config annotation) and
	// tolerated when absent.
	if want := "[[]/[pods]:[get list watch] [inference.networking.k8s.io]/[inferencepools]:[get list watch] " +
		"[llm-d.ai inference.networking.x-k8s.io]/[inferenceobjectives]:[get list watch] [events.k8s.io]/[events]:[create patch]]"; fmt.Sprint(rules) != want {
		t.Errorf("Role rules = %v, want exactly %s", rules, want)
	}
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != dep.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("RoleBinding %+v does not bind Role %s to the Deployment's ServiceAccount %s", binding, role.Name, dep.Spec.Template.Spec.ServiceAccountName)
	}
}

// TestSamplesMatchThePool checks the sample model servers are selected by the base pool, carry
// the seed's labels, and have config annotations Tandem accepts without a problem.
func TestSamplesMatchThePool(t *testing.T) {
	ip := typed[infv1.InferencePool](t, render(t, "base"), "InferencePool", "tandem-pool")
	roles := map[string]int{}
	for _, o := range render(t, "samples/pd-vllm") {
		d := typed[appsv1.Deployment](t, []*unstructured.Unstructured{o}, "Deployment", o.GetName())
		labels := d.Spec.Template.Labels
		for k, v := range ip.Spec.Selector.MatchLabels {
			if labels[string(k)] != string(v) {
				t.Errorf("%s: label %s=%q, the pool selects %q", d.Name, k, labels[string(k)], v)
			}
		}
		role, roleset, engine := pool.Classify(labels)
		roles[string(role)+"/"+roleset+"/"+engine]++
		raw := d.Spec.Template.Annotations[pool.AnnotationConfig]
		if _, problems, err := config.ParseModelConfig(raw, config.Names{}); err != nil || len(problems) != 0 {
			t.Errorf("%s: %s annotation %q: err %v, problems %v", d.Name, pool.AnnotationConfig, raw, err, problems)
		}
	}
	if fmt.Sprint(roles) != "map[decode/group-0/vllm:1 prefill/group-0/vllm:1 standard//vllm:1]" {
		t.Errorf("sample roles = %v, want one prefill and one decode in group-0 and one standard pod", roles)
	}
}

// apply creates objs in namespace ns and returns the kinds it skipped: vendorKinds, whose CRDs
// are not installed. Any other failure fails the test.
func apply(t *testing.T, env *k8stest.Env, ns string, objs []*unstructured.Unstructured) (skipped []string) {
	t.Helper()
	for _, o := range objs {
		o = o.DeepCopy()
		o.SetNamespace(ns)
		err := env.Client.Create(context.Background(), o)
		if meta.IsNoMatchError(err) && slices.Contains(vendorKinds, o.GetKind()) {
			skipped = append(skipped, o.GetKind())
			continue
		}
		if err != nil {
			t.Fatalf("create %s %s/%s: %v", o.GetKind(), ns, o.GetName(), err)
		}
	}
	return skipped
}

// startEnv is the control plane the apply tests share the shape of: InferencePool, Gateway API,
// prometheus-operator and Envoy AI Gateway's AIGatewayRoute CRDs.
func startEnv(t *testing.T) *k8stest.Env {
	return k8stest.Start(t, k8stest.WithGatewayAPI(), k8stest.WithPrometheusOperator(), k8stest.WithCRDs(aiGatewayCRDs))
}

// aiGatewayCRDs holds Envoy AI Gateway's AIGatewayRoute CRD, copied from its release.
const aiGatewayCRDs = "testdata/envoy-ai-gateway"

// TestApply creates every rendered object on a real apiserver, then runs the pool source as the
// EPP's ServiceAccount against the sample pods.
func TestApply(t *testing.T) {
	env := startEnv(t)
	ns := env.Namespace(t, "tandem")
	apply(t, env, ns, render(t, "base"))
	samples := render(t, "samples/pd-vllm")
	apply(t, env, ns, samples)
	for dir := range kustomizations {
		if !strings.HasPrefix(dir, "overlays/") && dir != "monitoring" {
			continue
		}
		t.Run(dir, func(t *testing.T) {
			skipped := apply(t, env, env.Namespace(t, filepath.Base(dir)), render(t, dir))
			t.Logf("not applied (vendor CRDs not installed): %v", skipped)
		})
	}

	checkEPPRights(t, env, ns, samples)
}

// checkEPPRights checks, in ns where the EPP's objects and the sample model servers were
// created, that the ServiceAccount tandem-epp may read what the EPP needs and nothing else, and
// that the pool source, running with only its rights, serves the sample pods of tandem-pool.
func checkEPPRights(t *testing.T, env *k8stest.Env, ns string, samples []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	// The ServiceAccount may read what the EPP needs, and nothing else.
	sa := rest.CopyConfig(env.Config)
	sa.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":tandem-epp"}
	saClient, err := client.New(sa, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	other := env.Namespace(t, "elsewhere")
	checks := []struct {
		what    string
		do      func() error
		allowed bool
	}{
		{"list pods", func() error { return saClient.List(ctx, &corev1.PodList{}, client.InNamespace(ns)) }, true},
		{"list inferencepools", func() error { return saClient.List(ctx, &infv1.InferencePoolList{}, client.InNamespace(ns)) }, true},
		{"list pods in another namespace", func() error { return saClient.List(ctx, &corev1.PodList{}, client.InNamespace(other)) }, false},
		{"list secrets", func() error { return saClient.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)) }, false},
		{"create a pod", func() error {
			return saClient.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: ns},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}}})
		}, false},
		{"list leases", func() error {
			return saClient.List(ctx, unstructuredList{"coordination.k8s.io", "v1", "LeaseList"}.Get(), client.InNamespace(ns))
		}, false},
	}
	for _, c := range checks {
		err := c.do()
		if c.allowed && err != nil {
			t.Errorf("ServiceAccount cannot %s: %v", c.what, err)
		}
		if !c.allowed && !apierr.IsForbidden(err) {
			t.Errorf("ServiceAccount may %s (err %v); the Role must not allow it", c.what, err)
		}
	}

	// Play the kubelet for the sample Deployments: one Ready pod each, from the template.
	for i, o := range samples {
		d := typed[appsv1.Deployment](t, []*unstructured.Unstructured{o}, "Deployment", o.GetName())
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: d.Name + "-0", Namespace: ns, Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations},
			Spec:       d.Spec.Template.Spec,
		}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatalf("create pod from %s: %v", d.Name, err)
		}
		if err := k8stest.SetPodStatus(ctx, env.Client, p, fmt.Sprintf("10.1.0.%d", i+1), true); err != nil {
			t.Fatal(err)
		}
	}
	store := pool.NewStore()
	changes := store.Changes()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- kube.Start(runCtx, sa, kube.Options{PoolName: "tandem-pool", PoolNamespace: ns, Store: store, Logger: testr.New(t)})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pool source: %v", err)
		}
	}()
	deadline := time.After(15 * time.Second)
	for {
		s := store.Load()
		if s.Synced && len(s.Endpoints) == 3 {
			var got []string
			for _, e := range s.Endpoints {
				got = append(got, fmt.Sprintf("%s %s %s", e.HostPort(), e.Role, e.Roleset))
			}
			// Sorted by pod name; the IPs follow the samples' order (prefill, decode, standard).
			want := "[10.1.0.2:8000 decode group-0 10.1.0.1:8000 prefill group-0 10.1.0.3:8000 standard ]"
			if fmt.Sprint(got) != want {
				t.Errorf("endpoints = %v, want %s", got, want)
			}
			return
		}
		select {
		case <-changes:
		case <-deadline:
			t.Fatalf("the pool source, as the ServiceAccount, never saw the 3 sample pods: synced=%v endpoints=%d", s.Synced, len(s.Endpoints))
		}
	}
}

// unstructuredList names a list kind the scheme does not know.
type unstructuredList struct{ group, version, kind string }

func (u unstructuredList) Get() *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion(u.group + "/" + u.version)
	l.SetKind(u.kind)
	return l
}

// defaultImage is the image the base runs; a user's kustomization replaces it by this name.
const defaultImage = "ghcr.io/tandem-epp/tandem-epp:latest"

// TestOwnImageRecipe follows manifests/README.md's "use your own image" recipe: a kustomization
// of one's own that uses base, with the images entry `kustomize edit set image NAME=IMAGE`
// writes, renders the Deployment with that image.
func TestOwnImageRecipe(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("`kustomize edit set image ([^=` ]+)=<registry>/tandem-epp:<tag>`").FindSubmatch(readme)
	if m == nil {
		t.Fatal("manifests/README.md has no `kustomize edit set image NAME=<registry>/tandem-epp:<tag>` recipe")
	}
	name := string(m[1])
	base, err := filepath.Abs("base")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, base) // kustomize takes relative paths only
	if err != nil {
		t.Fatal(err)
	}
	// What `kustomize edit set image NAME=registry.example/team/tandem-epp:v1.2.3` writes.
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\nimages:\n- name: %s\n  newName: registry.example/team/tandem-epp\n  newTag: v1.2.3\n", rel, name)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	dep := typed[appsv1.Deployment](t, render(t, dir), "Deployment", "tandem-epp")
	if got := dep.Spec.Template.Spec.Containers[0].Image; got != "registry.example/team/tandem-epp:v1.2.3" {
		t.Errorf("with the README's recipe the image is %q, want registry.example/team/tandem-epp:v1.2.3 (the base names its image %s)", got, defaultImage)
	}
}
