// Package testenv starts a real kube-apiserver and etcd (controller-runtime's envtest) for tests,
// with the InferencePool CRD and, on request, the Gateway API CRDs and prometheus-operator's
// ServiceMonitor and PrometheusRule CRDs installed from the module cache.
// The binaries come from hack/ensure-k8s-bins.sh (built once, cached outside the clone); nothing is skipped.
// It must not be imported by production code.
package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Module paths whose CRDs the environment installs.
const (
	gieModule        = "sigs.k8s.io/gateway-api-inference-extension"
	gatewayAPIModule = "sigs.k8s.io/gateway-api"
	// PrometheusOperatorModule is not a dependency of Tandem: it is downloaded by version.
	PrometheusOperatorModule = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
)

// Env is a running control plane. It stops when the test that started it ends.
type Env struct {
	// Config reaches the apiserver as an administrator.
	Config *rest.Config
	// Client is a client with Scheme (core, CRDs, InferencePool v1, Gateway API v1).
	Client client.Client
	Scheme *runtime.Scheme
}

type options struct {
	gatewayAPI         bool
	prometheusOperator bool
	crdDirs            []string
}

// Option changes what Start installs.
type Option func(*options)

// WithGatewayAPI also installs the Gateway API standard-channel CRDs (Gateway, HTTPRoute, ...).
func WithGatewayAPI() Option { return func(o *options) { o.gatewayAPI = true } }

// WithPrometheusOperator also installs prometheus-operator's ServiceMonitor and PrometheusRule
// CRDs (with their validation), for the monitoring manifests and the Helm chart.
func WithPrometheusOperator() Option { return func(o *options) { o.prometheusOperator = true } }

// WithCRDs also installs the CRDs in these directories (a gateway project's, kept in testdata).
func WithCRDs(dirs ...string) Option {
	return func(o *options) { o.crdDirs = append(o.crdDirs, dirs...) }
}

// NewScheme returns a scheme with the core Kubernetes types, CRDs, InferencePool v1 and Gateway API v1.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, infv1.Install, gwv1.Install} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Start launches kube-apiserver and etcd, installs the CRDs and waits until they are served.
// It fails the test (never skips it) if the binaries cannot be found or built.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	assets, err := AssetsDir()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	gieDir, err := ModuleDir(gieModule)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	crdDirs := []string{filepath.Join(gieDir, "config", "crd", "bases")}
	if o.gatewayAPI {
		gwDir, err := ModuleDir(gatewayAPIModule)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		crdDirs = append(crdDirs, filepath.Join(gwDir, "config", "crd", "standard"))
	}
	if o.prometheusOperator {
		dir, err := DownloadModule(PrometheusOperatorModule)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		for _, kind := range []string{"servicemonitors", "prometheusrules"} {
			crdDirs = append(crdDirs, filepath.Join(dir, "example", "prometheus-operator-crd", "monitoring.coreos.com_"+kind+".yaml"))
		}
	}
	crdDirs = append(crdDirs, o.crdDirs...)
	scheme, err := NewScheme()
	if err != nil {
		t.Fatalf("testenv: scheme: %v", err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	start := time.Now()
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("testenv: starting kube-apiserver and etcd from %s: %v", assets, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("testenv: stopping the control plane: %v", err)
		}
	})
	t.Logf("testenv: control plane up with %d CRD dir(s) in %v", len(crdDirs), time.Since(start).Round(time.Millisecond))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("testenv: client: %v", err)
	}
	return &Env{Config: cfg, Client: c, Scheme: scheme}
}

// Namespace creates a fresh namespace named after prefix and returns its name.
func (e *Env) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("testenv: creating namespace: %v", err)
	}
	return ns.Name
}

// SetPodStatus plays the kubelet: it writes the pod's IP, phase Running and the Ready condition
// through the status subresource. The pod must exist; it is updated in place.
func SetPodStatus(ctx context.Context, c client.Client, pod *corev1.Pod, ip string, ready bool) error {
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: now}}
	if err := c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("setting status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

var (
	assetsOnce sync.Once
	assetsDir  string
	assetsErr  error
)

// AssetsDir returns the directory holding kube-apiserver and etcd: KUBEBUILDER_ASSETS when it
// holds both, else what hack/ensure-k8s-bins.sh prints (it builds them on first use, ~6 min).
func AssetsDir() (string, error) {
	assetsOnce.Do(func() {
		if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" && hasBins(d) {
			assetsDir = d
			return
		}
		root, err := ModuleDir("")
		if err != nil {
			assetsErr = err
			return
		}
		script := filepath.Join(root, "hack", "ensure-k8s-bins.sh")
		cmd := exec.Command(script)
		cmd.Dir = root
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			assetsErr = fmt.Errorf("%s failed: %w", script, err)
			return
		}
		assetsDir = strings.TrimSpace(out.String())
		if !hasBins(assetsDir) {
			assetsErr = fmt.Errorf("%s printed %q, which lacks kube-apiserver or etcd", script, assetsDir)
		}
	})
	return assetsDir, assetsErr
}

func hasBins(dir string) bool {
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

// DownloadModule fetches module@version from the module proxy (once; then from the module cache)
// and returns its directory. It runs outside the repository, so go.mod and go.sum are untouched.
func DownloadModule(moduleAtVersion string) (string, error) {
	if d, ok := moduleDirs.Load(moduleAtVersion); ok {
		return d.(string), nil
	}
	cmd := exec.Command("go", "mod", "download", "-json", moduleAtVersion)
	cmd.Dir = os.TempDir()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w: %s%s", moduleAtVersion, err, strings.TrimSpace(stderr.String()), strings.TrimSpace(string(out)))
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s: no directory in %q (%v %s)", moduleAtVersion, out, err, info.Error)
	}
	moduleDirs.Store(moduleAtVersion, info.Dir)
	return info.Dir, nil
}

var moduleDirs sync.Map // module path (or module@version) -> dir

// ModuleDir returns the directory of a module in the build's module graph, as
// `go list -m -f {{.Dir}}` prints it; "" means the main module (the repository root).
func ModuleDir(module string) (string, error) {
	if d, ok := moduleDirs.Load(module); ok {
		return d.(string), nil
	}
	args := []string{"list", "-m", "-f", "{{.Dir}}"}
	if module != "" {
		args = append(args, module)
	}
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("go %s: module %q has no directory; run `go mod download %s`", strings.Join(args, " "), module, module)
	}
	moduleDirs.Store(module, dir)
	return dir, nil
}
