package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/testenv"
)

// The upstream conformance suite whose EPP arguments Tandem must accept.
const (
	upstreamModule  = "sigs.k8s.io/gateway-api-inference-extension/conformance"
	upstreamVersion = "v1.6.0"
	// Wire names the upstream suite uses.
	upstreamSelectionHeader = "test-epp-endpoint-selection"
	upstreamServedHeader    = "x-conformance-test-served-endpoint"
	upstreamHealthService   = "inference-extension"
)

// TestUpstreamArguments plays the upstream suite's cluster on a real apiserver and runs Tandem,
// once per EPP Deployment in resources/base.yaml, with that Deployment's arguments (see README.md
// for the three documented changes), as the ServiceAccount the upstream RBAC binds.
func TestUpstreamArguments(t *testing.T) {
	objs := upstreamBase(t)
	// The v1.6 test InferencePoolMissingEPPRef's pool has no endpointPickerRef; an EPP told to
	// follow it follows it like any other (it selects the primary model servers).
	missingRef := upstreamManifest(t, "tests/inferencepool_missing_epp_ref.yaml")
	objs = append(objs, missingRef...)
	env := testenv.Start(t, testenv.WithGatewayAPI())
	ctx := context.Background()

	var epps []*appsv1.Deployment
	pools := map[string]*infv1.InferencePool{}
	podsByNS := map[string][]*corev1.Pod{}
	for _, o := range objs {
		if err := env.Client.Create(ctx, o.DeepCopy()); err != nil {
			t.Fatalf("create %s %s/%s from base.yaml: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
		switch o.GetKind() {
		case "InferencePool":
			p := upstreamConvert[infv1.InferencePool](t, o)
			pools[p.Namespace+"/"+p.Name] = p
		case "Deployment":
			d := upstreamConvert[appsv1.Deployment](t, o)
			if upstreamIsEPP(d) {
				epps = append(epps, d)
				continue
			}
			// Play the ReplicaSet controller and the kubelet: one Ready pod per replica.
			replicas := 1
			if d.Spec.Replicas != nil {
				replicas = int(*d.Spec.Replicas)
			}
			for i := range replicas {
				p := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", d.Name, i), Namespace: d.Namespace, Labels: d.Spec.Template.Labels},
					Spec:       d.Spec.Template.Spec,
				}
				if err := env.Client.Create(ctx, p); err != nil {
					t.Fatalf("create pod for %s: %v", d.Name, err)
				}
				ip := fmt.Sprintf("10.%d.%d.%d", 100+len(podsByNS), len(podsByNS[d.Namespace])/200, len(podsByNS[d.Namespace])%200+1)
				if err := testenv.SetPodStatus(ctx, env.Client, p, ip, true); err != nil {
					t.Fatal(err)
				}
				podsByNS[d.Namespace] = append(podsByNS[d.Namespace], p)
			}
		}
	}
	if len(epps) < 2 || len(pools) != len(epps)+1 {
		t.Fatalf("base.yaml has %d EPP Deployments and, with the missing-ref test's, %d InferencePools; expected one EPP per base pool, several pools", len(epps), len(pools))
	}
	// An EPP for the pool without endpointPickerRef: the primary EPP's arguments, that pool named.
	for _, o := range missingRef {
		if o.GetKind() != "InferencePool" {
			continue
		}
		if pools[o.GetNamespace()+"/"+o.GetName()].Spec.EndpointPickerRef != nil {
			t.Fatalf("%s has an endpointPickerRef; the upstream test's pool should not", o.GetName())
		}
		d := epps[0].DeepCopy()
		d.Name = o.GetName() + "-endpoint-picker"
		args := &d.Spec.Template.Spec.Containers[0].Args
		*args = upstreamSetFlag(upstreamSetFlag(*args, "--pool-name", o.GetName()), "--pool-namespace", o.GetNamespace())
		epps = append(epps, d)
	}
	// Every endpoint of every pool, for the requests naming other pools' endpoints too.
	var everyIP []string
	for _, ip := range pools {
		for _, hp := range upstreamEndpoints(ip, podsByNS[ip.Namespace]) {
			if h, _, _ := net.SplitHostPort(hp); !slices.Contains(everyIP, h) {
				everyIP = append(everyIP, h)
			}
		}
	}

	for _, d := range epps {
		args := d.Spec.Template.Spec.Containers[0].Args
		poolKey := upstreamFlag(args, "--pool-namespace") + "/" + upstreamFlag(args, "--pool-name")
		t.Run(d.Name, func(t *testing.T) {
			ip, ok := pools[poolKey]
			if !ok {
				t.Fatalf("args %q name pool %s, which base.yaml does not define", args, poolKey)
			}
			want := upstreamEndpoints(ip, podsByNS[ip.Namespace])
			if len(want) == 0 {
				t.Fatalf("pool %s selects no pod", poolKey)
			}
			// The upstream RBAC binds the namespace's default ServiceAccount; Tandem runs as it.
			t.Setenv("KUBECONFIG", upstreamKubeconfig(t, env, "system:serviceaccount:"+d.Namespace+":"+upstreamServiceAccount(d)))
			upstreamRunEPP(t, args, want, everyIP)
		})
	}
}

// upstreamRunEPP starts Tandem with the upstream arguments, waits for health, and checks picks
// as the upstream tests steer them: want is the pool's endpoints, everyIP every pool's pod IPs.
func upstreamRunEPP(t *testing.T, upstreamArgs, want, everyIP []string) {
	grpcPort, healthPort, metricsPort := upstreamFreePort(t), upstreamFreePort(t), upstreamFreePort(t)
	args := append([]string{"--conformance"}, upstreamArgs...) // the conformance image's entrypoint
	args = upstreamSetFlag(args, "--grpc-port", strconv.Itoa(grpcPort))
	args = upstreamSetFlag(args, "--grpc-health-port", strconv.Itoa(healthPort))
	args = append(args, "--metrics-port", strconv.Itoa(metricsPort), "--bind-address", "127.0.0.1")
	t.Logf("upstream args %q\nrun as         %q\npool endpoints %v", upstreamArgs, args, want)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, args, io.Discard) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Tandem exited with %v", err)
			}
		case <-time.After(45 * time.Second):
			t.Errorf("Tandem did not stop within 45s of its context ending")
		}
	}
	defer stop()

	// Health: inference-extension must turn SERVING once the pool has synced.
	if err := demo.WaitServing(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(healthPort)), done, 30*time.Second); err != nil {
		if errors.Is(err, demo.ErrExited) {
			stopped = true
			t.Fatalf("Tandem exited before it was healthy: %v", err)
		}
		t.Fatalf("health %q never turned SERVING: %v", upstreamHealthService, err)
	}
	// And the Endpoint Picker Protocol's own health services (v1.6), as a probe asks them.
	hconn, err := grpc.NewClient(net.JoinHostPort("127.0.0.1", strconv.Itoa(healthPort)), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hconn.Close()
	for _, service := range []string{"liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		r, err := healthpb.NewHealthClient(hconn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v, want SERVING", service, r.GetStatus(), err)
		}
	}

	// Picks, over real ext_proc streams with TLS (--secure-serving defaults to true, as in lwepp).
	c, err := envoy.Dial(net.JoinHostPort("127.0.0.1", strconv.Itoa(grpcPort)), true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := []byte(`{"model":"conformance-fake-model","prompt":"Hello"}`)
	route := func(selection string) (string, *envoy.Stream, context.CancelFunc) {
		return upstreamRoute(ctx, t, c, selection, envoy.Request{
			Headers: envoy.Headers(":method", "POST", ":path", "/v1/completions", "content-type", "application/json"), Body: body})
	}
	upstreamChecks(t, want, everyIP, route)
	for _, path := range []string{"/", "/primary", "/secondary"} { // the upstream route tests send GETs without a body
		got, _, scancel := upstreamRoute(ctx, t, c, "", envoy.Request{Headers: envoy.Headers(":method", "GET", ":path", path), NoBody: true})
		scancel()
		if !slices.Contains(want, got) {
			t.Errorf("GET %s picked %s, which is not in the pool %v", path, got, want)
		}
	}
	stop()
}

// upstreamRoute routes r (with the selection header when not empty) and returns the primary.
func upstreamRoute(ctx context.Context, t *testing.T, c *envoy.Client, selection string, r envoy.Request) (string, *envoy.Stream, context.CancelFunc) {
	t.Helper()
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	if selection != "" {
		r.Headers = append(slices.Clone(r.Headers), envoy.Header{Key: upstreamSelectionHeader, Value: selection})
	}
	s, routed, err := c.Route(sctx, r)
	if err != nil {
		scancel()
		t.Fatalf("routing (selection %q): %v", selection, err)
	}
	if routed.Immediate != nil {
		scancel()
		t.Fatalf("routing (selection %q): immediate response %d %s", selection, routed.Immediate.Status, routed.Immediate.Body)
	}
	eps := routed.Endpoints()
	if len(eps) == 0 || routed.MetadataDestination == "" {
		scancel()
		t.Fatalf("routing (selection %q): no destination (header %q, metadata %q)", selection, routed.Destination, routed.MetadataDestination)
	}
	for _, e := range eps {
		if selection != "" && !upstreamSelected(selection, e) {
			t.Errorf("selection %q: endpoint %s (of %q) was not selected", selection, e, routed.Destination)
		}
	}
	return eps[0], s, scancel
}

// upstreamSelected says whether the selection header (IPs or IP:ports, comma-separated) names hostPort.
func upstreamSelected(selection, hostPort string) bool {
	host, _, _ := net.SplitHostPort(hostPort)
	for _, entry := range strings.Split(selection, ",") {
		if entry = strings.TrimSpace(entry); entry == host || entry == hostPort {
			return true
		}
	}
	return false
}

// upstreamChecks are the EPP-facing checks of the upstream tests (see README.md).
func upstreamChecks(t *testing.T, want, everyIP []string, route func(string) (string, *envoy.Stream, context.CancelFunc)) {
	t.Helper()
	// Without the selection header the pick is one of the pool's endpoints.
	for range 2 * len(want) {
		got, _, scancel := route("")
		scancel()
		if !slices.Contains(want, got) {
			t.Errorf("picked %s, which is not in the pool %v", got, want)
		}
	}
	// The upstream suite pins each endpoint with the selection header and reads the served one back.
	for _, hp := range want {
		got, s, scancel := route(hp)
		if got != hp {
			t.Errorf("selection %s picked %s", hp, got)
		}
		ans, err := s.Respond(envoy.Response{Status: 200, Headers: envoy.Headers("content-type", "application/json"), Served: hp, Chunks: [][]byte{[]byte(`{}`)}})
		scancel()
		if err != nil {
			t.Fatalf("response phase for %s: %v", hp, err)
		}
		if v := ans.Headers.Set[upstreamServedHeader]; v != hp {
			t.Errorf("%s = %q, want %q", upstreamServedHeader, v, hp)
		}
	}
	// GatewayFollowingEPPRouting: a list of pods; every pick is one of them (route checks it).
	var ips []string
	for _, hp := range want {
		if h, _, _ := net.SplitHostPort(hp); !slices.Contains(ips, h) {
			ips = append(ips, h)
		}
	}
	if len(ips) >= 2 {
		for range 6 {
			_, _, scancel := route(ips[0] + "," + ips[1])
			scancel()
		}
	}
	// GatewayWeightedAcrossTwoInferencePools: every pool's IPs in the header; the EPP ignores
	// the other pools' and picks from its own.
	for range 6 {
		got, _, scancel := route(strings.Join(everyIP, ","))
		scancel()
		if !slices.Contains(want, got) {
			t.Errorf("with every pool's IPs selected, picked %s, which is not in the pool %v", got, want)
		}
	}
}

// upstreamManifest reads one manifest of the upstream conformance module.
func upstreamManifest(t *testing.T, name string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(upstreamDir(t), filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return upstreamDecode(t, name, data)
}

// upstreamDir locates the upstream conformance module in the module cache.
func upstreamDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", upstreamModule+"@"+upstreamVersion).Output()
	if err != nil {
		t.Fatalf("go mod download %s@%s: %v", upstreamModule, upstreamVersion, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download %s@%s: %s %v", upstreamModule, upstreamVersion, mod.Error, err)
	}
	return mod.Dir
}

// upstreamBase reads resources/base.yaml from the upstream conformance module in the module cache.
func upstreamBase(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(upstreamDir(t), "resources", "base.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := upstreamDecode(t, "base.yaml", data)
	// Namespaces first, as kubectl would need them.
	sort.SliceStable(objs, func(i, j int) bool { return objs[i].GetKind() == "Namespace" && objs[j].GetKind() != "Namespace" })
	return objs
}

func upstreamDecode(t *testing.T, name string, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("%s: %v", name, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs
}

func upstreamConvert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &v); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return &v
}

// upstreamIsEPP tells the EPP Deployments from the model servers: only an EPP takes --pool-name.
func upstreamIsEPP(d *appsv1.Deployment) bool {
	cs := d.Spec.Template.Spec.Containers
	return len(cs) == 1 && slices.Contains(cs[0].Args, "--pool-name")
}

func upstreamServiceAccount(d *appsv1.Deployment) string {
	if sa := d.Spec.Template.Spec.ServiceAccountName; sa != "" {
		return sa
	}
	return "default"
}

// upstreamEndpoints is what lwepp would serve: Ready pods matching the selector × target ports.
func upstreamEndpoints(ip *infv1.InferencePool, pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		match := true
		for k, v := range ip.Spec.Selector.MatchLabels {
			match = match && p.Labels[string(k)] == string(v)
		}
		if !match {
			continue
		}
		for _, tp := range ip.Spec.TargetPorts {
			out = append(out, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(tp.Number))))
		}
	}
	return out
}

// upstreamFlag returns the value after flag in args ("" if absent).
func upstreamFlag(args []string, flag string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return args[i+1]
		}
	}
	return ""
}

// upstreamSetFlag replaces the value of flag (given as "--f v" or "--f=v"), or appends it.
func upstreamSetFlag(args []string, flag, value string) []string {
	out := slices.Clone(args)
	for i := range out {
		switch {
		case out[i] == flag && i+1 < len(out):
			out[i+1] = value
			return out
		case strings.HasPrefix(out[i], flag+"="):
			out[i] = flag + "=" + value
			return out
		}
	}
	return append(out, flag, value)
}

func upstreamFreePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// upstreamKubeconfig writes a kubeconfig for the test apiserver that acts as user (impersonation).
func upstreamKubeconfig(t *testing.T, env *testenv.Env, user string) string {
	t.Helper()
	cfg := env.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["as-sa"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken, Impersonate: user,
	}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "as-sa"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
