package e2e

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/testenv"
)

// 7. The same PD pick with the pool from Kubernetes: a real kube-apiserver + etcd hold an
// InferencePool and the pods; Tandem watches them (internal/pool/kube) and routes to the
// simulators on 127.0.0.1.
//
// Ports: an InferencePool has one set of target ports for all its pods, while the simulators
// listen on different ports of 127.0.0.1. The pool has a single target port (8000, where
// nothing listens) and each pod names its real serving port with the seed's
// model.aibrix.ai/port label, which the Kubernetes source honours for single-port pools
// (internal/pool/podports). Distinct loopback IPs were not needed.
func TestPDPickThroughKubernetesSource(t *testing.T) {
	env := testenv.Start(t)
	ns := env.Namespace(t, "e2e")
	ctx := testCtx(t, 90*time.Second)
	pods := startPods(t, pdPods("a", "b")...)

	createInferencePool(ctx, t, env, ns, "e2e-pool")
	objs := map[string]*corev1.Pod{}
	for _, name := range []string{"prefill-a", "decode-a", "prefill-b", "decode-b"} {
		objs[name] = createSimPod(ctx, t, env, ns, pods[name], nil)
	}

	a := startTandem(t, []string{"--pool-name=e2e-pool", "--pool-namespace=" + ns}, defaultEnv(nil), env.Config)
	waitEndpoints := func(want ...string) {
		t.Helper()
		eventually(t, fmt.Sprintf("Tandem's pool to hold %v", want), func() (bool, string) {
			snap := a.Store().Load()
			got := map[string]string{}
			for _, e := range snap.Endpoints {
				got[e.Name] = e.HostPort()
			}
			if len(got) != len(want) {
				return false, fmt.Sprintf("pool %v", got)
			}
			for _, n := range want {
				if got[n] != pods[n].HostPort() {
					return false, fmt.Sprintf("pool %v; %s should be at %s", got, n, pods[n].HostPort())
				}
			}
			return true, ""
		})
	}
	waitEndpoints("prefill-a", "decode-a", "prefill-b", "decode-b")
	s := &stack{t: t, pods: pods, tandem: a, gwURL: startGateway(t, a.ExtProcAddr()), client: newClient()}

	used := map[string]int{}
	for i := 0; i < 12; i++ {
		m := s.marker("kube")
		r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 100), 8, i%2 == 0), nil)
		if err := okCompletion(r, i%2 == 0); err != nil {
			t.Fatal(err)
		}
		used[checkPDRequest(t, s, m, r)]++
	}
	t.Logf("PD requests per roleset: %v", used)

	// The kubelet reports decode-b not Ready: rs-b loses its decode side and drops out.
	if err := testenv.SetPodStatus(ctx, env.Client, objs["decode-b"], "127.0.0.1", false); err != nil {
		t.Fatal(err)
	}
	waitEndpoints("prefill-a", "decode-a", "prefill-b")
	prefillB := countReceived(pods["prefill-b"])
	for i := 0; i < 12; i++ {
		m := s.marker("kube-nr")
		r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 100), 8, false), nil)
		if err := okCompletion(r, false); err != nil {
			t.Fatal(err)
		}
		if rs := checkPDRequest(t, s, m, r); rs != "rs-a" {
			t.Fatalf("with decode-b not Ready, request %s went to roleset %s", m, rs)
		}
	}
	if got := countReceived(pods["prefill-b"]); got != prefillB {
		t.Errorf("prefill-b received %d requests after its roleset lost its decode pod", got-prefillB)
	}
}

// The label the test pools select their pods by.
const selectorKey, selectorValue = "app", "tandem-e2e-sim"

// createInferencePool creates an InferencePool selecting the test pods, with the one target port
// 8000 (nothing listens there: each pod names its simulator's port with model.aibrix.ai/port).
func createInferencePool(ctx context.Context, t *testing.T, env *testenv.Env, ns, name string) {
	t.Helper()
	ip := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{selectorKey: selectorValue}},
			TargetPorts:       []infv1.Port{{Number: 8000}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "tandem", Port: &infv1.Port{Number: 9002}},
		},
	}
	if err := env.Client.Create(ctx, ip); err != nil {
		t.Fatalf("creating the InferencePool: %v", err)
	}
}

// createSimPod creates the Pod object of simulated pod p (its labels, plus extra) and reports
// it Ready at 127.0.0.1, as the kubelet would.
func createSimPod(ctx context.Context, t *testing.T, env *testenv.Env, ns string, p *pod, extra map[string]string) *corev1.Pod {
	t.Helper()
	labels := p.labels()
	labels[selectorKey] = selectorValue
	labels[pool.LabelModelPort] = strconv.Itoa(int(p.port()))
	maps.Copy(labels, extra)
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: ns, Labels: labels, Annotations: p.annotations()},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	if err := env.Client.Create(ctx, obj); err != nil {
		t.Fatalf("creating pod %s: %v", p.name, err)
	}
	if err := testenv.SetPodStatus(ctx, env.Client, obj, "127.0.0.1", true); err != nil {
		t.Fatal(err)
	}
	return obj
}
