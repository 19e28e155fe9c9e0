package kube

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/testenv"
)

func TestOptionsValidate(t *testing.T) {
	store := pool.NewStore()
	cases := []struct {
		name string
		opts Options
		want string // substring of the error, "" for none
	}{
		{"defaults", Options{PoolName: "p", Store: store}, ""},
		{"explicit group", Options{PoolName: "p", PoolGroup: "inference.networking.k8s.io", Store: store}, ""},
		{"alpha group", Options{PoolName: "p", PoolGroup: "inference.networking.x-k8s.io", Store: store},
			`--pool-group "inference.networking.x-k8s.io" is not supported: only inference.networking.k8s.io (InferencePool v1) is`},
		{"no name", Options{Store: store}, "--pool-name is required"},
		{"no store", Options{PoolName: "p"}, "Store is nil"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			err := o.validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				if o.PoolNamespace != "default" || o.PoolGroup != PoolGroup || o.MetricsBindAddress != "0" {
					t.Errorf("defaults not applied: %+v", o)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestKubeSource runs the source against a real kube-apiserver; each subtest has its own namespace.
func TestKubeSource(t *testing.T) {
	env := testenv.Start(t)

	t.Run("ready, not ready, deleted", func(t *testing.T) {
		h := newHarness(t, env, []int32{8000}, map[string]string{"app": "vllm"})
		h.wait("synced, no pods", func(s *pool.Snapshot) bool { return s.Synced && len(s.Endpoints) == 0 })

		bound := h.pod("bound", map[string]string{"app": "vllm"}, nil, "node-1")
		loose := h.pod("loose", map[string]string{"app": "vllm"}, nil, "")
		other := h.pod("other", map[string]string{"app": "sglang"}, nil, "")
		h.status(other, "10.0.0.9", true)
		h.status(bound, "10.0.0.1", false)
		h.status(loose, "10.0.0.2", true)
		h.wait("only the ready matching pod", hostPorts("10.0.0.2:8000"))

		h.status(bound, "10.0.0.1", true)
		s := h.wait("both ready", hostPorts("10.0.0.1:8000", "10.0.0.2:8000"))
		// The node a pod runs on is its nearest topology label, for topology-aware pairing.
		if e, _ := s.ByHostPort("10.0.0.1:8000"); e == nil || e.Labels[corev1.LabelHostname] != "node-1" {
			t.Errorf("bound pod's labels %v: want %s=node-1 from spec.nodeName", e.Labels, corev1.LabelHostname)
		}
		if e, _ := s.ByHostPort("10.0.0.2:8000"); e == nil || e.Labels[corev1.LabelHostname] != "" {
			t.Errorf("unscheduled pod's labels %v: want no %s", e.Labels, corev1.LabelHostname)
		}

		h.status(loose, "10.0.0.2", false)
		h.wait("not-ready pod left", hostPorts("10.0.0.1:8000"))

		// A pod bound to a node is deleted gracefully: it stays with a deletionTimestamp, and must leave at once.
		if err := env.Client.Delete(h.ctx, bound); err != nil {
			t.Fatal(err)
		}
		h.wait("terminating pod left", hostPorts())
		var still corev1.Pod
		if err := env.Client.Get(h.ctx, client.ObjectKeyFromObject(bound), &still); err != nil || still.DeletionTimestamp == nil {
			t.Errorf("expected pod %s to remain with a deletionTimestamp (err %v)", bound.Name, err)
		}

		h.status(loose, "10.0.0.2", true)
		h.wait("ready again", hostPorts("10.0.0.2:8000"))
		if err := env.Client.Delete(h.ctx, loose); err != nil {
			t.Fatal(err)
		}
		s = h.wait("deleted pod left", hostPorts())
		if !s.Synced || s.Info.Name != "pool" || s.Info.AppProtocol != "http" || fmt.Sprint(s.Info.TargetPorts) != "[8000]" {
			t.Errorf("info = %+v synced=%v", s.Info, s.Synced)
		}
	})

	t.Run("appProtocol and a pool without endpointPickerRef", func(t *testing.T) {
		h := newHarness(t, env, []int32{8000}, map[string]string{"app": "h2c"})
		p := h.pod("h2c-0", map[string]string{"app": "h2c"}, nil, "")
		h.status(p, "10.0.2.1", true)
		h.wait("http by default", func(s *pool.Snapshot) bool {
			return s.Synced && s.Info.AppProtocol == "http" && len(s.Endpoints) == 1
		})
		h.updatePool(func(ip *infv1.InferencePool) {
			ip.Spec.AppProtocol = infv1.AppProtocolH2C
			ip.Spec.EndpointPickerRef = nil // optional since v1.5
		})
		s := h.wait("h2c, no endpointPickerRef, still followed", func(s *pool.Snapshot) bool {
			return s.Synced && s.Info.AppProtocol == "kubernetes.io/h2c"
		})
		if e, ok := s.ByHostPort("10.0.2.1:8000"); !ok || e.Rank != 0 || len(s.Endpoints) != 1 {
			t.Errorf("endpoints %v: want the pod's one endpoint, unchanged by the protocol", s.Endpoints)
		}
		h.updatePool(func(ip *infv1.InferencePool) { ip.Spec.AppProtocol = infv1.AppProtocolHTTP })
		h.wait("back to http", func(s *pool.Snapshot) bool { return s.Synced && s.Info.AppProtocol == "http" && len(s.Endpoints) == 1 })
	})

	t.Run("multi-port ranks and active-ports", func(t *testing.T) {
		h := newHarness(t, env, []int32{3000, 3002, 3004}, map[string]string{"app": "dp"})
		p := h.pod("dp-0", map[string]string{"app": "dp"}, nil, "")
		h.status(p, "10.0.1.1", true)
		s := h.wait("one endpoint per port", hostPorts("10.0.1.1:3000", "10.0.1.1:3002", "10.0.1.1:3004"))
		for _, want := range []struct {
			hp   string
			rank int
		}{{"10.0.1.1:3000", 0}, {"10.0.1.1:3002", 1}, {"10.0.1.1:3004", 2}} {
			if e, _ := s.ByHostPort(want.hp); e == nil || e.Rank != want.rank || e.Key() != h.ns+"/dp-0:"+want.hp[len("10.0.1.1:"):] {
				t.Errorf("%s: endpoint %+v, want rank %d", want.hp, e, want.rank)
			}
		}
		if got := len(s.ByAddress("10.0.1.1")); got != 3 {
			t.Errorf("ByAddress = %d endpoints, want 3", got)
		}

		h.update(p, func(p *corev1.Pod) { p.Annotations = map[string]string{pool.AnnotationActivePorts: "3004,3000"} })
		s = h.wait("active ports 3000,3004", hostPorts("10.0.1.1:3000", "10.0.1.1:3004"))
		if e, _ := s.ByHostPort("10.0.1.1:3004"); e == nil || e.Rank != 2 {
			t.Errorf("rank of 3004 = %+v, want 2", e)
		}
		h.update(p, func(p *corev1.Pod) { p.Annotations = map[string]string{pool.AnnotationLLMDActivePorts: "3002"} })
		h.wait("llm-d active ports 3002", hostPorts("10.0.1.1:3002"))
	})

	t.Run("labels classify roles and override the port", func(t *testing.T) {
		h := newHarness(t, env, []int32{8000}, map[string]string{"model.aibrix.ai/name": "m"})
		labels := map[string]string{"model.aibrix.ai/name": "m", "role-name": "prefill", "roleset-name": "group-0", "model.aibrix.ai/engine": "sglang"}
		p := h.pod("pd-0", labels, nil, "")
		h.status(p, "10.0.2.1", true)
		s := h.wait("prefill pod", hostPorts("10.0.2.1:8000"))
		if e := s.Endpoints[0]; e.Role != pool.RolePrefill || e.Roleset != "group-0" || e.Engine != "sglang" || e.Model != "m" {
			t.Errorf("endpoint = role %q roleset %q engine %q model %q", e.Role, e.Roleset, e.Engine, e.Model)
		}
		h.update(p, func(p *corev1.Pod) { p.Labels["role-name"] = "decode"; p.Labels["roleset-name"] = "group-1" })
		h.wait("reclassified as decode", func(s *pool.Snapshot) bool {
			return len(s.Endpoints) == 1 && s.Endpoints[0].Role == pool.RoleDecode && s.Endpoints[0].Roleset == "group-1"
		})
		h.update(p, func(p *corev1.Pod) { p.Labels[pool.LabelModelPort] = "8100" })
		h.wait("model.aibrix.ai/port overrides the single target port", hostPorts("10.0.2.1:8100"))
		h.update(p, func(p *corev1.Pod) { delete(p.Labels, "role-name") })
		h.wait("standard without role-name", func(s *pool.Snapshot) bool {
			return len(s.Endpoints) == 1 && s.Endpoints[0].Role == pool.RoleStandard
		})
	})

	t.Run("pool selector and ports change", func(t *testing.T) {
		h := newHarness(t, env, []int32{8000}, map[string]string{"app": "a"})
		a := h.pod("a-0", map[string]string{"app": "a"}, nil, "")
		b := h.pod("b-0", map[string]string{"app": "b"}, nil, "")
		h.status(a, "10.0.3.1", true)
		h.status(b, "10.0.3.2", true)
		h.wait("selector app=a", hostPorts("10.0.3.1:8000"))

		h.updatePool(func(p *infv1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[infv1.LabelKey]infv1.LabelValue{"app": "b"}
			p.Spec.TargetPorts = []infv1.Port{{Number: 9000}, {Number: 9001}}
		})
		s := h.wait("selector app=b, two ports", hostPorts("10.0.3.2:9000", "10.0.3.2:9001"))
		if fmt.Sprint(s.Info.TargetPorts) != "[9000 9001]" {
			t.Errorf("target ports = %v", s.Info.TargetPorts)
		}

		// An unrelated pod's change publishes nothing; the next real change is exactly one version later.
		before := h.store.Load().Version
		h.update(a, func(p *corev1.Pod) { p.Annotations = map[string]string{"x": "y"} })
		h.update(b, func(p *corev1.Pod) { p.Labels["role-name"] = "decode" })
		s = h.wait("b relabelled", func(s *pool.Snapshot) bool {
			return len(s.Endpoints) == 2 && s.Endpoints[0].Role == pool.RoleDecode
		})
		if s.Version != before+1 {
			t.Errorf("version went %d -> %d; an event that changed nothing published a snapshot", before, s.Version)
		}
	})

	t.Run("pool missing, created, deleted", func(t *testing.T) {
		ns := env.Namespace(t, "kube")
		store := pool.NewStore()
		changes := store.Changes()
		p := h0(t, env, ns, store)
		p.run(func(ctx context.Context) error {
			return Start(ctx, env.Config, Options{PoolName: "pool", PoolNamespace: ns, Store: store, Logger: logr.Discard()})
		})
		pd := p.pod("m-0", map[string]string{"app": "m"}, nil, "")
		p.status(pd, "10.0.4.1", true)
		// The pod's event reconciles with no pool: empty and not synced.
		p.waitOn(changes, "pod seen, pool missing", func(s *pool.Snapshot) bool { return s.Version > 0 && !s.Synced })
		p.createPool([]int32{8000}, map[string]string{"app": "m"})
		p.waitOn(changes, "pool created", func(s *pool.Snapshot) bool { return s.Synced && hostPorts("10.0.4.1:8000")(s) })
		if err := env.Client.Delete(p.ctx, p.poolObj); err != nil {
			t.Fatal(err)
		}
		p.waitOn(changes, "pool deleted", func(s *pool.Snapshot) bool { return !s.Synced && len(s.Endpoints) == 0 })
	})

	t.Run("only the pool's namespace is cached", func(t *testing.T) {
		ns := env.Namespace(t, "kube")
		other := env.Namespace(t, "kube-other")
		for _, n := range []string{ns, other} {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "same", Namespace: n, Labels: map[string]string{"app": "x"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
			}
			if err := env.Client.Create(context.Background(), pod); err != nil {
				t.Fatal(err)
			}
			ip := "10.0.5.1"
			if n == other {
				ip = "10.0.5.2"
			}
			if err := testenv.SetPodStatus(context.Background(), env.Client, pod, ip, true); err != nil {
				t.Fatal(err)
			}
		}
		store := pool.NewStore()
		changes := store.Changes()
		h := h0(t, env, ns, store)
		h.createPool([]int32{8000}, map[string]string{"app": "x"})
		mgr, err := NewManager(env.Config, Options{PoolName: "pool", PoolNamespace: ns, Store: store, Logger: testr.New(t)})
		if err != nil {
			t.Fatal(err)
		}
		h.run(mgr.Start)
		h.waitOn(changes, "own namespace only", func(s *pool.Snapshot) bool { return s.Synced && hostPorts("10.0.5.1:8000")(s) })
		var pods corev1.PodList
		if err := mgr.GetCache().List(h.ctx, &pods, client.InNamespace(other)); err == nil {
			t.Errorf("the cache listed namespace %s (%d pods); it must hold only %s", other, len(pods.Items), ns)
		}
	})

	t.Run("conflicts and bad labels route safely", func(t *testing.T) {
		h := newHarness(t, env, []int32{8000}, map[string]string{"app": "c"})
		// Two pods claiming one address:port (host networking, a stale status): the first by name keeps it.
		a := h.pod("c-0", map[string]string{"app": "c"}, nil, "")
		b := h.pod("c-1", map[string]string{"app": "c"}, nil, "")
		// A port label that is not a port: logged, and the target port is used.
		bad := h.pod("c-2", map[string]string{"app": "c", pool.LabelModelPort: "http"}, nil, "")
		h.status(b, "10.0.6.1", true)
		h.status(a, "10.0.6.1", true)
		h.status(bad, "10.0.6.2", true)
		s := h.wait("one owner per address, bad label ignored", hostPorts("10.0.6.1:8000", "10.0.6.2:8000"))
		if e, _ := s.ByHostPort("10.0.6.1:8000"); e == nil || e.Name != "c-0" {
			t.Errorf("10.0.6.1:8000 belongs to %+v, want pod c-0", e)
		}
	})

	// Last, as it removes the CRD from the shared apiserver.
	t.Run("CRD missing", func(t *testing.T) {
		ctx := context.Background()
		crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "inferencepools.inference.networking.k8s.io"}}
		if err := env.Client.Delete(ctx, crd); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(crd), crd)) {
			if time.Now().After(deadline) {
				t.Fatal("the InferencePool CRD was not removed within 30s")
			}
			time.Sleep(50 * time.Millisecond) // polling the apiserver for the condition, bounded above
		}
		// Discovery drops the resource a moment after the CRD is gone; until then the manager
		// would (rightly) start.
		for servesInferencePool(env.Config) == nil {
			if time.Now().After(deadline) {
				t.Fatal("discovery still lists inferencepools 30s after the CRD was removed")
			}
			time.Sleep(50 * time.Millisecond) // as above
		}
		_, err := NewManager(env.Config, Options{PoolName: "pool", Store: pool.NewStore()})
		want := "kube: the cluster does not serve InferencePool inference.networking.k8s.io/v1; install the Gateway API Inference Extension CRDs (v1.0 or later)"
		if err == nil || err.Error() != want {
			t.Errorf("err = %v, want %q", err, want)
		}
	})
}

// harness runs one source in one namespace and waits on its store.
type harness struct {
	t       *testing.T
	env     *testenv.Env
	ctx     context.Context
	ns      string
	store   *pool.Store
	changes <-chan struct{}
	poolObj *infv1.InferencePool
}

// newHarness creates a pool in a fresh namespace and starts the source on it.
func newHarness(t *testing.T, env *testenv.Env, ports []int32, selector map[string]string) *harness {
	ns := env.Namespace(t, "kube")
	store := pool.NewStore()
	h := h0(t, env, ns, store)
	h.changes = store.Changes()
	h.createPool(ports, selector)
	h.run(func(ctx context.Context) error {
		return Start(ctx, env.Config, Options{PoolName: "pool", PoolNamespace: ns, Store: store, Logger: testr.New(t)})
	})
	return h
}

// h0 returns a harness for namespace ns; no source runs until run is called.
func h0(t *testing.T, env *testenv.Env, ns string, store *pool.Store) *harness {
	return &harness{t: t, env: env, ctx: context.Background(), ns: ns, store: store}
}

// run starts a source; it is stopped, and must return, when the test ends.
func (h *harness) run(start func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				h.t.Errorf("source stopped: %v", err)
			}
		case <-time.After(20 * time.Second):
			h.t.Errorf("source did not stop within 20s of its context ending")
		}
	})
}

func (h *harness) createPool(ports []int32, selector map[string]string) {
	h.t.Helper()
	p := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: h.ns},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "epp", Port: &infv1.Port{Number: 9002}},
		},
	}
	for k, v := range selector {
		p.Spec.Selector.MatchLabels[infv1.LabelKey(k)] = infv1.LabelValue(v)
	}
	for _, port := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, infv1.Port{Number: infv1.PortNumber(port)})
	}
	if err := h.env.Client.Create(h.ctx, p); err != nil {
		h.t.Fatalf("create pool: %v", err)
	}
	h.poolObj = p
}

func (h *harness) updatePool(change func(*infv1.InferencePool)) {
	h.t.Helper()
	change(h.poolObj)
	if err := h.env.Client.Update(h.ctx, h.poolObj); err != nil {
		h.t.Fatalf("update pool: %v", err)
	}
}

func (h *harness) pod(name string, labels, annotations map[string]string, node string) *corev1.Pod {
	h.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns, Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "engine", Image: "vllm"}}},
	}
	if err := h.env.Client.Create(h.ctx, p); err != nil {
		h.t.Fatalf("create pod %s: %v", name, err)
	}
	return p
}

func (h *harness) status(p *corev1.Pod, ip string, ready bool) {
	h.t.Helper()
	if err := testenv.SetPodStatus(h.ctx, h.env.Client, p, ip, ready); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) update(p *corev1.Pod, change func(*corev1.Pod)) {
	h.t.Helper()
	change(p)
	if err := h.env.Client.Update(h.ctx, p); err != nil {
		h.t.Fatalf("update pod %s: %v", p.Name, err)
	}
}

func (h *harness) wait(what string, ok func(*pool.Snapshot) bool) *pool.Snapshot {
	h.t.Helper()
	return h.waitOn(h.changes, what, ok)
}

// waitOn returns the first snapshot that satisfies ok, checking after every publish, for at most 15s.
func (h *harness) waitOn(changes <-chan struct{}, what string, ok func(*pool.Snapshot) bool) *pool.Snapshot {
	h.t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		s := h.store.Load()
		if ok(s) {
			return s
		}
		select {
		case <-changes:
		case <-deadline:
			h.t.Fatalf("%s: not reached within 15s; last snapshot v%d synced=%v endpoints=%v", what, s.Version, s.Synced, describe(s))
		}
	}
}

// hostPorts matches a synced snapshot whose endpoints are exactly these ip:port.
func hostPorts(want ...string) func(*pool.Snapshot) bool {
	sort.Strings(want)
	return func(s *pool.Snapshot) bool { return s.Synced && fmt.Sprint(describe(s)) == fmt.Sprint(want) }
}

func describe(s *pool.Snapshot) []string {
	out := []string{}
	for _, e := range s.Endpoints {
		out = append(out, e.HostPort())
	}
	sort.Strings(out)
	return out
}

// A pool that does not exist, in a namespace without pods, raises no watch event: Tandem still
// says at start that it is missing.
func TestMissingPoolIsReported(t *testing.T) {
	env := testenv.Start(t)
	ns := env.Namespace(t, "nopool")
	said := make(chan string, 16)
	log := funcr.New(func(prefix, args string) {
		select {
		case said <- args:
		default:
		}
	}, funcr.Options{})
	h := h0(t, env, ns, pool.NewStore())
	h.run(func(ctx context.Context) error {
		return Start(ctx, env.Config, Options{PoolName: "pool", PoolNamespace: ns, Store: h.store, Logger: log})
	})
	deadline := time.After(30 * time.Second)
	for {
		select {
		case line := <-said:
			if strings.Contains(line, "InferencePool not found") {
				return
			}
		case <-deadline:
			t.Fatal("no \"InferencePool not found\" line within 30 s of starting on a missing pool")
		}
	}
}
