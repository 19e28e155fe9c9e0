package app

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/testenv"
)

// A pod with a bad model.aibrix.ai/config annotation, in a real cluster: routing goes on
// (the pod keeps the defaults) and a Warning event lands on the pod.
func TestBadAnnotationGetsAKubernetesEvent(t *testing.T) {
	env := testenv.Start(t)
	ns := env.Namespace(t, "tandem-app")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
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
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "standard-0", Namespace: ns, Labels: map[string]string{"app": "vllm", "model.aibrix.ai/name": "m"},
			Annotations: map[string]string{"model.aibrix.ai/config": `{"profiles":{"default":{"routingStrategy":"pd","routingConfig":{"combined":true,"prefillScorePolicy":"fastest"}}}}`}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}},
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if err := testenv.SetPodStatus(ctx, c, pod, "127.0.0.1", true); err != nil {
		t.Fatal(err)
	}

	getenv := func(string) string { return "" }
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

	ec, err := envoy.Dial(a.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	s, err := ec.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := envoy.Request{Method: "POST", Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"hi"}`)}
	if err := s.SendRequest(req); err != nil {
		t.Fatal(err)
	}
	r, err := s.ReadRoute(req)
	if err != nil || r.Immediate != nil {
		t.Fatalf("the bad annotation must not break routing: %v %+v", err, r)
	}
	if got := r.Endpoints(); len(got) == 0 || got[0] != "127.0.0.1:8000" {
		t.Fatalf("destination %v", got)
	}

	// The event is written asynchronously by the recorder: poll the API with a deadline.
	for {
		var list eventsv1.EventList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Regarding.Name == "standard-0" && e.Reason == "BadRoutingConfig" && strings.Contains(e.Note, "prefillScorePolicy") {
				// What applies is what Tandem does: the bad field is dropped, the rest kept.
				if !strings.Contains(e.Note, "the field is left out, the rest of the annotation applies") || strings.Contains(e.Note, "last good") {
					t.Fatalf("event note %q misstates what applies", e.Note)
				}
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no BadRoutingConfig event on the pod; events: %+v", list.Items)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
