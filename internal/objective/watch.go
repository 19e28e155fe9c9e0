//go:build !nokube

package objective

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Kinds are the InferenceObjective API versions watched, in precedence order: llm-d's
// (llm-d-router v0.10 and later, where the type moved with GIE v1.6), then GIE's older one
// (GIE v1.0–v1.5). An objective named in both takes llm-d.ai's priority.
var Kinds = []schema.GroupVersionKind{
	{Group: "llm-d.ai", Version: "v1alpha2", Kind: "InferenceObjective"},
	{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Kind: "InferenceObjective"},
}

// resource is the plural the API server serves InferenceObjective under.
const resource = "inferenceobjectives"

// DefaultPoolGroup is an objective's spec.poolRef.group when it has none (the CRDs' default).
const DefaultPoolGroup = "inference.networking.k8s.io"

// WatchOptions say which objectives belong to the pool.
type WatchOptions struct {
	// Namespace is the pool's; objectives reference a pool of their own namespace.
	Namespace string
	// PoolName and PoolGroup are the pool objectives must reference (spec.poolRef).
	PoolName, PoolGroup string
	Set                 *Set
	Logger              logr.Logger
}

// Watch adds to mgr a controller per InferenceObjective API version the cluster serves (Kinds),
// keeping o.Set in step with the objectives of o.Namespace whose spec.poolRef names the pool. A
// version the cluster does not serve is skipped with a log line: Tandem then runs without it
// (a CRD installed later is seen after a restart). It needs get/list/watch on the served ones.
func Watch(mgr manager.Manager, cfg *rest.Config, o WatchOptions) error {
	if o.Set == nil {
		return errors.New("objective.Watch: Set is nil")
	}
	if o.PoolGroup == "" {
		o.PoolGroup = DefaultPoolGroup
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("InferenceObjective: %w", err)
	}
	for _, gvk := range Kinds {
		o.Set.sources = append(o.Set.sources, gvk.Group)
	}
	for _, gvk := range Kinds {
		served, err := serves(dc, gvk.GroupVersion())
		if err != nil {
			// Discovery failing for one group must not stop the pool: log and go on without it.
			o.Logger.Error(err, "InferenceObjective: cannot ask the API server; skipped", "apiVersion", gvk.GroupVersion().String())
			continue
		}
		if !served {
			o.Logger.Info("InferenceObjective CRD not installed; skipped (x-gateway-inference-objective names only objectives of the installed groups)",
				"apiVersion", gvk.GroupVersion().String())
			continue
		}
		r := &reconciler{reader: mgr.GetCache(), gvk: gvk, o: o}
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(gvk)
		// Every event maps to one request per group, so bursts coalesce into one relist.
		one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.Namespace, Name: gvk.Group}}}
		})
		if err := builder.ControllerManagedBy(mgr).Named("tandem-inferenceobjective-"+gvk.Group).
			Watches(obj, one).Complete(r); err != nil {
			return fmt.Errorf("InferenceObjective %s: creating the controller: %w", gvk.GroupVersion(), err)
		}
		o.Logger.Info("watching InferenceObjectives", "apiVersion", gvk.GroupVersion().String(), "namespace", o.Namespace,
			"pool", o.PoolName)
	}
	return nil
}

func serves(dc discovery.DiscoveryInterface, gv schema.GroupVersion) (bool, error) {
	list, err := dc.ServerResourcesForGroupVersion(gv.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true, nil
		}
	}
	return false, nil
}

type reconciler struct {
	reader client.Reader
	gvk    schema.GroupVersionKind
	o      WatchOptions
}

// Reconcile relists the group's objectives of the namespace and publishes those of the pool.
func (r *reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(r.gvk.GroupVersion().WithKind(r.gvk.Kind + "List"))
	if err := r.reader.List(ctx, list, client.InNamespace(r.o.Namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing InferenceObjectives %s: %w", r.gvk.GroupVersion(), err)
	}
	byName := map[string]int{}
	for i := range list.Items {
		name, prio, ok := r.ofPool(&list.Items[i])
		if ok {
			byName[name] = prio
		}
	}
	r.o.Set.setSource(r.gvk.Group, byName)
	r.o.Logger.V(1).Info("InferenceObjectives updated", "apiVersion", r.gvk.GroupVersion().String(), "objectives", len(byName))
	return reconcile.Result{}, nil
}

// ofPool reads an object's name and priority (unset: 0), ok only when it references the pool
// and is not being deleted.
func (r *reconciler) ofPool(u *unstructured.Unstructured) (string, int, bool) {
	if u.GetDeletionTimestamp() != nil {
		return "", 0, false
	}
	name, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "name")
	group, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "group")
	if group == "" {
		group = DefaultPoolGroup
	}
	if name != r.o.PoolName || group != r.o.PoolGroup {
		return "", 0, false
	}
	prio, found, err := unstructured.NestedInt64(u.Object, "spec", "priority")
	if err != nil || !found {
		prio = 0
	}
	return u.GetName(), int(prio), true
}
