// Package kube feeds the pool Store from Kubernetes: one InferencePool (v1,
// inference.networking.k8s.io) and the Ready pods its selector matches, one endpoint per pod ×
// live target port. It caches only the pool's namespace, needs only get/list/watch on pods and
// inferencepools, and must not score, pick or write to the API server.
//
// The lead wires it with:
//
//	err := kube.Start(ctx, restConfig, kube.Options{PoolName: ..., PoolNamespace: ..., PoolGroup: ..., Store: store, Logger: log})
//
// Start blocks until ctx ends (it runs a controller-runtime manager); NewManager returns the
// manager instead, for callers that want to add runnables or start it themselves. Both fail at
// once, saying what to install, if the cluster does not serve InferencePool v1.
//
// What is published, and when:
//   - Every change of the endpoint set (or of the pool's target ports, app protocol) publishes a
//     new snapshot; events that change nothing publish nothing. Bursts of pod events coalesce
//     into one reconcile, so a publish reflects the cache at that moment.
//   - Synced is true once the pool object was found with the pod cache synced (the controller
//     reconciles only after its caches have synced).
//   - A pod counts while it has an IP, the Ready condition True and no deletionTimestamp; the
//     first update that breaks one of these removes its endpoints, as does its deletion.
//   - Ports and ranks follow internal/pool/podports: rank = index in targetPorts, the
//     active-ports annotation restricts ports, and model.aibrix.ai/port overrides the port of a
//     single-port pool.
//   - If the pool is deleted (or was never created), the snapshot is empty with Synced=false,
//     as lwepp does: health turns NOT_SERVING until the pool exists again.
//   - spec.appProtocol is published as given, "http" when unset; it does not change endpoints.
//   - A pool without spec.endpointPickerRef (optional since InferencePool v1.5) is followed
//     like any other; the missing reference is logged, since gateways that require it route
//     nothing of that pool to an EPP.
package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/pool/podports"
)

// PoolGroup is the only InferencePool API group supported (InferencePool v1).
const PoolGroup = "inference.networking.k8s.io"

// Options says which pool to follow and where to publish it.
type Options struct {
	// PoolName is the InferencePool's name (required).
	PoolName string
	// PoolNamespace is its namespace; "" means "default", as lwepp does.
	PoolNamespace string
	// PoolGroup must be "" or inference.networking.k8s.io.
	PoolGroup string
	// Store receives the snapshots (required).
	Store *pool.Store
	// PairMatch are the labels whose values must match between paired pods (each
	// endpoint's Revision); nil matches none.
	PairMatch pool.PairMatch
	// Logger is used by the manager and the reconciler; the zero value discards.
	Logger logr.Logger
	// MetricsBindAddress is controller-runtime's metrics server; "" or "0" turns it off
	// (Tandem serves its own /metrics).
	MetricsBindAddress string
}

func (o *Options) validate() error {
	var errs []error
	if o.PoolName == "" {
		errs = append(errs, errors.New("--pool-name is required to follow an InferencePool (or use --endpoints-file)"))
	}
	if o.PoolNamespace == "" {
		o.PoolNamespace = "default"
	}
	if o.PoolGroup == "" {
		o.PoolGroup = PoolGroup
	}
	if o.PoolGroup != PoolGroup {
		errs = append(errs, fmt.Errorf("--pool-group %q is not supported: only %s (InferencePool v1) is", o.PoolGroup, PoolGroup))
	}
	if o.Store == nil {
		errs = append(errs, errors.New("kube.Options.Store is nil"))
	}
	if o.MetricsBindAddress == "" {
		o.MetricsBindAddress = "0"
	}
	return errors.Join(errs...)
}

// Start runs the pool source until ctx ends. It returns at once if the options are invalid.
func Start(ctx context.Context, cfg *rest.Config, opts Options) error {
	mgr, err := NewManager(cfg, opts)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// NewManager builds a controller-runtime manager that caches only the pool's namespace (pods,
// and the one InferencePool by name) and runs the reconciler. Start it with mgr.Start(ctx).
func NewManager(cfg *rest.Config, opts Options) (manager.Manager, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := servesInferencePool(cfg); err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := infv1.Install(scheme); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 opts.Logger,
		Metrics:                metricsserver.Options{BindAddress: opts.MetricsBindAddress},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{opts.PoolNamespace: {}},
			ByObject: map[client.Object]cache.ByObject{
				&infv1.InferencePool{}: {Field: fields.OneTermEqualSelector("metadata.name", opts.PoolName)},
				&corev1.Pod{}:          {Transform: trimPod},
			},
		},
	})
	if meta.IsNoMatchError(err) {
		// The CRD went away after the check above: discovery lags a deletion.
		return nil, noInferencePool()
	}
	if err != nil {
		return nil, fmt.Errorf("kube: creating the manager: %w", err)
	}
	r := &reconciler{
		reader:    mgr.GetCache(),
		key:       types.NamespacedName{Namespace: opts.PoolNamespace, Name: opts.PoolName},
		store:     opts.Store,
		pairMatch: opts.PairMatch,
		log:       opts.Logger.WithValues("pool", opts.PoolNamespace+"/"+opts.PoolName),
		warned:    map[string]string{},
	}
	// Every event maps to the single pool request, so the work queue coalesces bursts.
	toPool := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: r.key}}
	})
	// One reconcile at start whatever the watches bring: a pool that does not exist, in a
	// namespace without pods, raises no event, and its absence would never be reported.
	start := make(chan event.GenericEvent, 1)
	start <- event.GenericEvent{Object: &infv1.InferencePool{}}
	err = builder.ControllerManagedBy(mgr).
		Named("tandem-inferencepool").
		Watches(&infv1.InferencePool{}, toPool).
		Watches(&corev1.Pod{}, toPool).
		WatchesRawSource(source.Channel(start, toPool)).
		Complete(r)
	if meta.IsNoMatchError(err) {
		// As above, found only when the watch is made.
		return nil, noInferencePool()
	}
	if err != nil {
		return nil, fmt.Errorf("kube: creating the controller: %w", err)
	}
	return mgr, nil
}

// servesInferencePool fails with the fix when the cluster lacks the InferencePool v1 CRD, instead of
// the manager's less helpful error (or its cache waiting for a kind that never comes).
func servesInferencePool(cfg *rest.Config) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kube: %w", err)
	}
	gv := PoolGroup + "/v1"
	list, err := dc.ServerResourcesForGroupVersion(gv)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: asking the API server for %s: %w", gv, err)
	}
	if list != nil {
		for _, r := range list.APIResources {
			if r.Name == "inferencepools" {
				return nil
			}
		}
	}
	return noInferencePool()
}

// noInferencePool is the error, with its fix, for a cluster without the InferencePool v1 CRD.
func noInferencePool() error {
	return fmt.Errorf("kube: the cluster does not serve InferencePool %s/v1; install the Gateway API Inference Extension CRDs (v1.0 or later)", PoolGroup)
}

// trimPod keeps only what the reconciler reads, so the cache holds little per pod.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	meta := p.ObjectMeta
	meta.ManagedFields = nil
	return &corev1.Pod{
		TypeMeta:   p.TypeMeta,
		ObjectMeta: meta,
		Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName}, // the node: the pod's nearest topology label
		Status:     corev1.PodStatus{PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs, Conditions: p.Status.Conditions, Phase: p.Status.Phase},
	}, nil
}

// reconciler rebuilds the pool's endpoint set from the cache. It runs one reconcile at a time.
type reconciler struct {
	reader client.Reader
	key    types.NamespacedName
	store  *pool.Store
	log    logr.Logger
	// pairMatch reads each endpoint's Revision.
	pairMatch pool.PairMatch

	last      *published
	warned    map[string]string // pod key -> warnings last logged, so each is logged once
	pickerRef string            // the pool's endpointPickerRef last logged ("none": unset)
}

type published struct {
	info      pool.Info
	endpoints []*pool.Endpoint // sorted by Key
	synced    bool
}

func (r *reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var ip infv1.InferencePool
	if err := r.reader.Get(ctx, r.key, &ip); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("reading InferencePool %s: %w", r.key, err)
		}
		if r.last == nil || r.last.synced {
			r.log.Info("InferencePool not found; the pool is empty and not ready until it exists")
		}
		r.publish(pool.Info{Name: r.key.Name, Namespace: r.key.Namespace}, nil, false)
		return reconcile.Result{}, nil
	}

	info := pool.Info{Name: ip.Name, Namespace: ip.Namespace, AppProtocol: appProtocol(ip.Spec.AppProtocol)}
	r.noteEndpointPickerRef(&ip)
	for _, p := range ip.Spec.TargetPorts {
		info.TargetPorts = append(info.TargetPorts, int32(p.Number))
	}
	selector := client.MatchingLabels{}
	for k, v := range ip.Spec.Selector.MatchLabels {
		selector[string(k)] = string(v)
	}
	var endpoints []*pool.Endpoint
	if len(selector) > 0 { // the CRD requires a selector; an empty one selects nothing, never everything
		var pods corev1.PodList
		if err := r.reader.List(ctx, &pods, client.InNamespace(r.key.Namespace), selector, client.UnsafeDisableDeepCopy); err != nil {
			return reconcile.Result{}, fmt.Errorf("listing pods of InferencePool %s: %w", r.key, err)
		}
		endpoints = r.endpoints(pods.Items, info.TargetPorts)
	}
	if r.last == nil || !r.last.synced {
		r.log.Info("InferencePool synced", "targetPorts", info.TargetPorts, "endpoints", len(endpoints))
	}
	r.publish(info, endpoints, true)
	return reconcile.Result{}, nil
}

// appProtocol is the pool's protocol to its model servers: "http" (HTTP/1.1) when unset, as
// the API defaults it (a CRD older than the field leaves it empty). It tells the gateway how to
// reach the pods; the endpoints and the routing are the same for every value.
func appProtocol(p infv1.AppProtocol) string {
	if p == "" {
		return string(infv1.AppProtocolHTTP)
	}
	return string(p)
}

// noteEndpointPickerRef logs, when it changes, whether the pool names an endpoint picker. The
// field is optional since InferencePool v1.5: a pool without it is followed all the same (its
// selector and target ports define the endpoints, and readiness follows the sync), but a
// gateway that requires the field marks the pool Accepted=False (EndpointPickerRefMissing) and
// sends it no traffic, so this EPP will see none for it.
func (r *reconciler) noteEndpointPickerRef(ip *infv1.InferencePool) {
	ref := "none"
	if er := ip.Spec.EndpointPickerRef; er != nil {
		ref = string(er.Kind) + "/" + string(er.Name)
	}
	if ref == r.pickerRef {
		return
	}
	r.pickerRef = ref
	if ref == "none" {
		r.log.Info("InferencePool has no endpointPickerRef; following it anyway. Gateways that require one report the pool Accepted=False (EndpointPickerRefMissing) and route none of its traffic here; set spec.endpointPickerRef to this EPP's Service to receive it")
		return
	}
	r.log.V(1).Info("InferencePool endpoint picker", "endpointPickerRef", ref)
}

// podLabels is a copy of the pod's labels with its node's name under kubernetes.io/hostname
// when the pod does not set that label itself: topology-aware pairing's nearest level is the
// node, which Kubernetes labels nodes with, not pods.
func podLabels(p *corev1.Pod) map[string]string {
	l := maps.Clone(p.Labels)
	if p.Spec.NodeName == "" {
		return l
	}
	if l == nil {
		l = map[string]string{}
	}
	if _, ok := l[corev1.LabelHostname]; !ok {
		l[corev1.LabelHostname] = p.Spec.NodeName
	}
	return l
}

// endpoints builds the endpoints of the routable pods. The pods are the cache's own objects:
// they are read, never kept or modified (maps are copied).
func (r *reconciler) endpoints(pods []corev1.Pod, targetPorts []int32) []*pool.Endpoint {
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	var out []*pool.Endpoint
	owner := map[string]string{} // host:port -> pod that claimed it first
	seen := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if !routable(p) {
			continue
		}
		podKey := p.Namespace + "/" + p.Name
		seen[podKey] = true
		eps, warnings := podports.Endpoints(p.Namespace, p.Name, p.Status.PodIP, targetPorts, podLabels(p), maps.Clone(p.Annotations), r.pairMatch)
		for _, e := range eps {
			if other, dup := owner[e.HostPort()]; dup {
				warnings = append(warnings, podports.Warning{Field: "status.podIP", Value: e.HostPort(),
					Problem: "already served by pod " + other, Effect: "endpoint skipped"})
				continue
			}
			owner[e.HostPort()] = p.Name
			out = append(out, e)
		}
		r.warnOnce(podKey, warnings)
	}
	for k := range r.warned {
		if !seen[k] {
			delete(r.warned, k)
		}
	}
	return out
}

func (r *reconciler) warnOnce(podKey string, warnings []podports.Warning) {
	texts := make([]string, len(warnings))
	for i, w := range warnings {
		texts[i] = w.String()
	}
	joined := strings.Join(texts, "; ")
	if r.warned[podKey] == joined {
		return
	}
	r.warned[podKey] = joined
	if joined != "" {
		r.log.Info("pod routes with warnings", "pod", podKey, "warnings", texts)
	}
}

// routable says whether a pod may receive traffic: it has a valid IP, is Ready and is not being deleted.
func routable(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" || net.ParseIP(p.Status.PodIP) == nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// publish stores a new snapshot unless it would equal the last one.
func (r *reconciler) publish(info pool.Info, endpoints []*pool.Endpoint, synced bool) {
	sort.Slice(endpoints, func(i, j int) bool { return endpoints[i].Key() < endpoints[j].Key() })
	next := &published{info: info, endpoints: endpoints, synced: synced}
	if r.last != nil && r.last.equal(next) {
		return
	}
	r.last = next
	snap := r.store.Publish(info, endpoints, synced)
	r.log.V(1).Info("pool published", "version", snap.Version, "endpoints", len(endpoints), "synced", synced)
}

func (a *published) equal(b *published) bool {
	if a.synced != b.synced || a.info.Name != b.info.Name || a.info.Namespace != b.info.Namespace ||
		a.info.AppProtocol != b.info.AppProtocol || !slices.Equal(a.info.TargetPorts, b.info.TargetPorts) ||
		len(a.endpoints) != len(b.endpoints) {
		return false
	}
	for i, x := range a.endpoints {
		y := b.endpoints[i]
		if x.Key() != y.Key() || x.Address != y.Address || x.Rank != y.Rank ||
			!maps.Equal(x.Labels, y.Labels) || !maps.Equal(x.Annotations, y.Annotations) {
			return false
		}
	}
	return true
}
