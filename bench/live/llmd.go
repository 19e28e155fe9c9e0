package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/testenv"
)

// llmdConfig is llm-d's EndpointPickerConfig for prefill/decode as its repository ships it for
// P/D (deploy/config/pd-epp-config.yaml of llm-d-inference-scheduler v0.7.1): the P/D profile
// handler with the prefix-based decider (disaggregate when at least 16 prompt tokens are not
// in the decode pod's prefix cache), the prefill and decode role filters, and in both
// profiles the prefix-cache scorer (weight 2) and the queue scorer (weight 1) under the
// max-score picker; disagg-headers-handler writes x-prefiller-host-port for the decode pod's
// routing sidecar. The prefix cache blocks are 16 tokens, as the simulator's.
const llmdConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates:
- prepareDataPlugins
plugins:
- type: disagg-headers-handler
- type: prefix-cache-scorer
  parameters:
    blockSizeTokens: 16
    autoTune: false
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters:
    nonCachedTokens: 16
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: prefix-based-pd-decider
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
`

// llmd is llm-d's EPP with the control plane it watches, and the local gateway in front.
type llmd struct {
	env     *envtest.Environment
	epp, gw *proc
	url     string
}

func (l *llmd) stop() {
	for _, p := range []*proc{l.gw, l.epp} {
		if p != nil {
			p.stop()
		}
	}
	if l.env != nil {
		_ = l.env.Stop()
	}
}

// startLLMD starts a kube-apiserver and etcd (the ones the tests run, hack/ensure-k8s-bins.sh)
// with the InferencePool CRD, creates an InferencePool and one Pod per simulated pod with llm-d's role label (prefill, decode; the standard pods
// unlabelled, which llm-d's decode filter takes as decode pods) and its address as the pod IP,
// Ready, then runs llm-d's EPP on the pods its selector matches, every pod on podPort, and the
// local gateway in front of it.
func startLLMD(ctx context.Context, dir string, bins binaries, pods []*pod) (l *llmd, err error) {
	l = &llmd{}
	defer func() {
		if err != nil {
			l.stop()
		}
	}()
	ctrllog.SetLogger(logr.Discard()) // envtest logs through controller-runtime; the report says what matters
	assets, err := testenv.AssetsDir()
	if err != nil {
		return l, err
	}
	scheme, err := testenv.NewScheme()
	if err != nil {
		return l, err
	}
	gie, err := testenv.ModuleDir("sigs.k8s.io/gateway-api-inference-extension")
	if err != nil {
		return l, err
	}
	l.env = &envtest.Environment{BinaryAssetsDirectory: assets, Scheme: scheme,
		CRDDirectoryPaths: []string{filepath.Join(gie, "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := l.env.Start()
	if err != nil {
		return l, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", assets, err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, l.env.KubeConfig, 0o600); err != nil {
		return l, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return l, err
	}
	// GIE v1.4.0's standalone mode (--endpoint-selector, no InferencePool) cannot start: its
	// flag check wants --pool-name empty and its pool then wants it set. So the pool is an
	// InferencePool, as llm-d deploys it: every pod on one target port.
	ip := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "live", Namespace: "default"},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{"app": "tandem-bench-live"}},
			TargetPorts:       []infv1.Port{{Number: podPort}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "llm-d-epp", Port: &infv1.Port{Number: 9002}},
		},
	}
	if err := c.Create(ctx, ip); err != nil {
		return l, fmt.Errorf("creating the InferencePool: %w", err)
	}
	for _, p := range pods {
		labels := map[string]string{"app": "tandem-bench-live"}
		if p.role != "standard" {
			labels["llm-d.ai/role"] = p.role
		}
		kp := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "default", Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "llm-d-inference-sim",
				Ports: []corev1.ContainerPort{{ContainerPort: podPort}}}}},
		}
		if err := c.Create(ctx, kp); err != nil {
			return l, fmt.Errorf("creating pod %s: %w", p.name, err)
		}
		if err := testenv.SetPodStatus(ctx, c, kp, p.host, true); err != nil {
			return l, err
		}
	}
	cfgFile := filepath.Join(dir, "llmd-epp-config.yaml")
	if err := os.WriteFile(cfgFile, []byte(llmdConfig), 0o600); err != nil {
		return l, err
	}
	ports, err := demo.FreePorts(4)
	if err != nil {
		return l, err
	}
	grpcPort, healthPort, metricsPort, gwPort := ports[0], ports[1], ports[2], ports[3]
	l.epp, err = start(dir, "llm-d-epp", bins.llmdEPP, []string{
		"--pool-name", "live",
		"--pool-namespace", "default",
		"--grpc-port", strconv.Itoa(grpcPort),
		"--grpc-health-port", strconv.Itoa(healthPort),
		"--metrics-port", strconv.Itoa(metricsPort),
		"--metrics-endpoint-auth=false",
		"--tracing=false", // on by default, to the console: a cost per request no deployment pays
		"--config-file", cfgFile,
	}, []string{"KUBECONFIG=" + kubeconfig, "POD_NAME=llm-d-epp", "POD_NAMESPACE=default"})
	if err != nil {
		return l, err
	}
	if err := waitTCP(ctx, "127.0.0.1:"+strconv.Itoa(grpcPort), l.epp, 60*time.Second); err != nil {
		return l, err
	}
	gwAddr := "127.0.0.1:" + strconv.Itoa(gwPort)
	l.gw, err = start(dir, "llm-d-gateway", bins.gateway, []string{
		"--listen", gwAddr, "--epp", "127.0.0.1:" + strconv.Itoa(grpcPort), "--stream-end", "envoy",
	}, nil)
	if err != nil {
		return l, err
	}
	if err := waitTCP(ctx, gwAddr, l.gw, 30*time.Second); err != nil {
		return l, err
	}
	l.url = "http://" + gwAddr
	return l, waitRouted(ctx, l.url, l.epp, 60*time.Second)
}
