package testenv

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// TestStart checks the real apiserver serves the CRDs (with their validation) and the pod status subresource.
func TestStart(t *testing.T) {
	env := Start(t, WithGatewayAPI())
	ctx := context.Background()
	ns := env.Namespace(t, "testenv")

	good := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{"app": "x"}},
			TargetPorts:       []infv1.Port{{Number: 8000}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "epp", Port: &infv1.Port{Number: 9002}},
		},
	}
	if err := env.Client.Create(ctx, good); err != nil {
		t.Fatalf("create InferencePool: %v", err)
	}
	if good.Spec.AppProtocol != infv1.AppProtocolHTTP {
		t.Errorf("appProtocol defaulted to %q, want http (CRD defaults not applied?)", good.Spec.AppProtocol)
	}
	dup := good.DeepCopy()
	dup.ObjectMeta = metav1.ObjectMeta{Name: "dup", Namespace: ns}
	dup.Spec.TargetPorts = []infv1.Port{{Number: 8000}, {Number: 8000}}
	if err := env.Client.Create(ctx, dup); err == nil || !strings.Contains(err.Error(), "port number must be unique") {
		t.Errorf("duplicate target ports: err = %v, want the CRD's CEL rule to reject them", err)
	}

	route := &gwv1.HTTPRouteList{}
	if err := env.Client.List(ctx, route); err != nil {
		t.Errorf("HTTPRoute CRD not served: %v", err)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	if err := SetPodStatus(ctx, env.Client, pod, "10.9.8.7", true); err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "p"}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.PodIP != "10.9.8.7" || len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Status != corev1.ConditionTrue {
		t.Errorf("pod status = %+v, want IP 10.9.8.7 and Ready", got.Status)
	}
}
