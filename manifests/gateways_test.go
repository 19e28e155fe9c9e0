package manifests_test

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	k8stest "github.com/tandem-epp/tandem/internal/testenv"
)

// TestEnvoyAIGatewayOverlayValidates applies overlays/envoy-gateway to a real kube-apiserver with
// Envoy AI Gateway's AIGatewayRoute CRD installed (testdata/envoy-ai-gateway, copied from its
// v1.1.0 release): the route to the InferencePool is accepted by the CRD's schema and CEL rules,
// and the same route with a backend group AI Gateway does not support is refused, so the check
// is the CRD's and not a formality.
func TestEnvoyAIGatewayOverlayValidates(t *testing.T) {
	env := k8stest.Start(t, k8stest.WithGatewayAPI(), k8stest.WithCRDs(aiGatewayCRDs))
	ctx := context.Background()
	ns := env.Namespace(t, "aigw")
	objs := render(t, "overlays/envoy-gateway")
	var route *unstructured.Unstructured
	for _, o := range objs {
		o = o.DeepCopy()
		o.SetNamespace(ns)
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		if o.GetKind() == "AIGatewayRoute" {
			route = o
		}
		if o.GetKind() == "HTTPRoute" {
			t.Errorf("the overlay keeps an HTTPRoute %s: plain Envoy Gateway rejects its InferencePool backend", o.GetName())
		}
	}
	if route == nil {
		t.Fatal("no AIGatewayRoute rendered")
	}
	refs, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
	backend := refs[0].(map[string]any)["backendRefs"].([]any)[0].(map[string]any)
	if backend["group"] != "inference.networking.k8s.io" || backend["kind"] != "InferencePool" || backend["name"] != "tandem-pool" {
		t.Errorf("AIGatewayRoute backend = %v, want the InferencePool tandem-pool", backend)
	}

	bad := route.DeepCopy()
	bad.SetName("bad-group")
	bad.SetResourceVersion("")
	rules, _, _ := unstructured.NestedSlice(bad.Object, "spec", "rules")
	rules[0].(map[string]any)["backendRefs"].([]any)[0].(map[string]any)["group"] = "inference.networking.x-k8s.io"
	if err := unstructured.SetNestedSlice(bad.Object, rules, "spec", "rules"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "inference.networking.k8s.io") {
		t.Errorf("an AIGatewayRoute to an unsupported InferencePool group was not refused by the CRD: %v", err)
	}
}

// TestNGINXGatewayFabricOverlay: the EPP is told its client applies only the destination header,
// and the route strips, nginx-side, every header a decode-side sidecar or the gateway acts on.
func TestNGINXGatewayFabricOverlay(t *testing.T) {
	objs := render(t, "overlays/nginx-gateway-fabric")
	dep := typed[appsv1.Deployment](t, objs, "Deployment", "tandem-epp")
	args := strings.ReplaceAll(strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "), "$(NAMESPACE)", "llm")
	opts, err := app.ParseFlags(strings.Fields(args), io.Discard, func(string) string { return "" })
	if err != nil {
		t.Fatalf("the EPP rejects the overlay's args %q: %v", args, err)
	}
	if opts.GatewayClient != config.ClientDestinationOnly || !opts.SecureServing {
		t.Errorf("args %q: gateway client %q secure %v; want destination-only over TLS (NGF's shim skips verification)", args, opts.GatewayClient, opts.SecureServing)
	}
	gw := typed[gwv1.Gateway](t, objs, "Gateway", "inference-gateway")
	if gw.Spec.GatewayClassName != "nginx" {
		t.Errorf("gatewayClassName = %q, want nginx (NGF's default GatewayClass)", gw.Spec.GatewayClassName)
	}
	route := typed[gwv1.HTTPRoute](t, objs, "HTTPRoute", "tandem-route")
	var removed []string
	for _, f := range route.Spec.Rules[0].Filters {
		if f.Type == gwv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil {
			removed = append(removed, f.RequestHeaderModifier.Remove...)
		}
	}
	for _, h := range []string{"x-prefiller-host-port", "x-encoder-hosts-ports", "x-data-parallel-host-port",
		"x-gateway-destination-endpoint", "x-gateway-destination-endpoint-served", "x-gateway-destination-endpoint-subset"} {
		if !slices.Contains(removed, h) {
			t.Errorf("the route does not remove %s (removes %v)", h, removed)
		}
	}
}

// TestSingleEndpointGatewaysGetThePrimaryAlone: the overlays of gateways that read the
// destination as one ip:port (agentgateway; Envoy AI Gateway's ORIGINAL_DST cluster) turn the
// fallback list off; the others keep the default.
func TestSingleEndpointGatewaysGetThePrimaryAlone(t *testing.T) {
	for dir, want := range map[string]string{
		"overlays/kgateway":             config.FallbacksOff,
		"overlays/envoy-gateway":        config.FallbacksOff,
		"overlays/istio":                config.FallbacksAuto,
		"overlays/nginx-gateway-fabric": config.FallbacksAuto, // destination-only: primary alone by default
		"base":                          config.FallbacksAuto,
	} {
		dep := typed[appsv1.Deployment](t, render(t, dir), "Deployment", "tandem-epp")
		args := strings.ReplaceAll(strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "), "$(NAMESPACE)", "llm")
		opts, err := app.ParseFlags(strings.Fields(args), io.Discard, func(string) string { return "" })
		if err != nil {
			t.Fatalf("%s: the EPP rejects %q: %v", dir, args, err)
		}
		if opts.DestinationFallbacks != want {
			t.Errorf("%s: --destination-fallbacks=%s, want %s", dir, opts.DestinationFallbacks, want)
		}
	}
}
