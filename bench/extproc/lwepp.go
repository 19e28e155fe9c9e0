package main

import (
	"context"
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/lwepp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/lwepp/handlers"
)

// newLWEPP builds upstream lwepp's handler over a datastore holding the same endpoints.
func newLWEPP(n int) extprocv3.ExternalProcessorServer {
	ctx := context.Background()
	ds := datastore.NewDatastore(ctx).WithEndpointPool(&datastore.EndpointPool{
		Selector: map[string]string{"app": "bench"}, TargetPorts: []int{8000}, Namespace: "bench",
	})
	for i := 0; i < n; i++ {
		ds.PodUpdateOrAddIfNotExist(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Namespace: "bench", Labels: map[string]string{"app": "bench"}},
			Status: corev1.PodStatus{PodIP: benchIP(i), Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		})
	}
	return handlers.NewStreamingServer(ds)
}

// benchIP gives endpoint i a loopback address; nothing ever connects to it.
func benchIP(i int) string { return fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250) }
