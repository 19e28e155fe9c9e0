package app

import (
	"context"
	"io"
	"maps"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/tandem-epp/tandem/internal/objective"
	"github.com/tandem-epp/tandem/internal/testenv"
)

// InferenceObjectives on a real API server, in both groups: llm-d.ai/v1alpha2 (llm-d-router
// v0.10) and inference.networking.x-k8s.io/v1alpha2 (GIE v1.3, its own CRD). Tandem takes the
// objectives of its pool from both (llm-d.ai first for a name in both), ignores another pool's,
// follows deletes, and sheds a request naming a negative priority that no pod can serve in time.
// (Without these CRDs, TestBadAnnotationGetsAKubernetesEvent's cluster, Tandem starts and routes.)
func TestObjectivesFromKubernetesShed(t *testing.T) {
	gie13, err := testenv.DownloadModule("sigs.k8s.io/gateway-api-inference-extension@v1.3.1")
	if err != nil {
		t.Fatal(err)
	}
	env := testenv.Start(t, testenv.WithCRDs("testdata/objective-crds",
		filepath.Join(gie13, "config", "crd", "bases", "inference.networking.x-k8s.io_inferenceobjectives.yaml")))
	ns := env.Namespace(t, "tandem-objective")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := env.Client
	pool := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{"app": "vllm"}},
			TargetPorts:       []infv1.Port{{Number: 8000}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "epp", Port: &infv1.Port{Number: 9002}},
		},
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// A PD pair (the decode pod names llm-d's sidecar, so no hand-off runs) and a standard pod.
	for _, p := range []struct {
		name, ip string
		labels   map[string]string
	}{
		{"prefill-0", "127.0.0.2", map[string]string{"role-name": "prefill", "roleset-name": "group-0"}},
		{"decode-0", "127.0.0.3", map[string]string{"role-name": "decode", "roleset-name": "group-0", "llm-d.ai/role": "decode"}},
		{"standard-0", "127.0.0.1", nil},
	} {
		labels := map[string]string{"app": "vllm", "model.aibrix.ai/name": "m"}
		maps.Copy(labels, p.labels)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: ns, Labels: labels,
				Annotations: map[string]string{"model.aibrix.ai/config": `{"profiles":{"default":{"routingConfig":{"combined":true}}}}`}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}},
		}
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		if err := testenv.SetPodStatus(ctx, c, pod, p.ip, true); err != nil {
			t.Fatal(err)
		}
	}
	create := func(group, name, poolName string, priority *int64) *unstructured.Unstructured {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": group + "/v1alpha2", "kind": "InferenceObjective",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"poolRef": map[string]any{"name": poolName}},
		}}
		if priority != nil {
			_ = unstructured.SetNestedField(u.Object, *priority, "spec", "priority")
		}
		if err := c.Create(ctx, u); err != nil {
			t.Fatalf("creating %s %s: %v", group, name, err)
		}
		return u
	}
	prio := func(p int64) *int64 { return &p }
	const llmd, gie = "llm-d.ai", "inference.networking.x-k8s.io"
	create(gie, "batch", "pool", prio(-1))
	create(llmd, "chat", "pool", prio(5))
	create(llmd, "both", "pool", prio(3))
	create(gie, "both", "pool", prio(-2))
	create(llmd, "unset", "pool", nil)
	create(llmd, "elsewhere", "other-pool", prio(-7))
	stale := create(llmd, "stale", "pool", prio(-3))

	// The pods do not run: passive health would eject them at their first refused scrape,
	// a race with the requests below that this test is not about.
	getenv := func(k string) string { return map[string]string{"TANDEM_OUTLIER_DETECTION": "false"}[k] }
	opts, err := ParseFlags([]string{"--pool-name=pool", "--pool-namespace=" + ns, "--grpc-port=0", "--grpc-health-port=0",
		"--metrics-port=0", "--bind-address=127.0.0.1", "--secure-serving=false"}, io.Discard, getenv)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(ctx, opts, Env{Getenv: getenv, RestConfig: env.Config})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() { stop(); <-done }()
	waitSynced(t, a)

	want := map[string]int{"batch": -1, "chat": 5, "both": 3, "unset": 0, "stale": -3}
	waitObjectives(ctx, t, a.objectives, want)
	if err := c.Delete(ctx, stale); err != nil {
		t.Fatal(err)
	}
	delete(want, "stale")
	waitObjectives(ctx, t, a.objectives, want)

	checkObjectiveShedding(t, a)
}

// waitObjectives polls the set (its watch is asynchronous) until it holds exactly want.
func waitObjectives(ctx context.Context, t *testing.T, s *objective.Set, want map[string]int) {
	t.Helper()
	for {
		got := map[string]int{}
		for _, name := range []string{"batch", "chat", "both", "unset", "elsewhere", "stale"} {
			if p, ok := s.Priority(nil, name); ok {
				got[name] = p
			}
		}
		if maps.Equal(got, want) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("objectives %v, want %v", got, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
