//go:build !nokube

package app

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/tandem-epp/tandem/internal/objective"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/pool/kube"
)

// RestConfig is the Kubernetes client configuration (Env.RestConfig).
type RestConfig = rest.Config

// setKubeLogger makes log controller-runtime's logger too.
func setKubeLogger(log logr.Logger) { ctrl.SetLogger(log) }

// kubeSource follows the InferencePool named by opts, its pods and the InferenceObjectives of
// the pool, into store and objectives; bad pod annotations also become Warning events.
func kubeSource(opts *Options, env Env, store *pool.Store, match pool.PairMatch, objectives *objective.Set, tel *tel, log logr.Logger) (func(context.Context) error, error) {
	rc := env.RestConfig
	if rc == nil {
		var err error
		if rc, err = restConfig(opts.Kubeconfig); err != nil {
			return nil, err
		}
	}
	mgr, err := kube.NewManager(rc, kube.Options{PoolName: opts.PoolName, PoolNamespace: opts.PoolNamespace,
		PoolGroup: opts.PoolGroup, Store: store, PairMatch: match, Logger: log.WithName("kube")})
	if err != nil {
		return nil, err
	}
	if err := objective.Watch(mgr, rc, objective.WatchOptions{Namespace: opts.PoolNamespace,
		PoolName: opts.PoolName, PoolGroup: opts.PoolGroup, Set: objectives, Logger: log.WithName("objectives")}); err != nil {
		return nil, err
	}
	events := mgr.GetEventRecorder("tandem-epp")
	tel.podWarning = func(namespace, name, reason, message string) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
		events.Eventf(pod, nil, corev1.EventTypeWarning, reason, "Route", "%s", message)
	}
	return mgr.Start, nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig=%s: %w", kubeconfig, err)
		}
		return c, nil
	}
	c, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes configuration (in-cluster, $KUBECONFIG or --kubeconfig): %w; without a cluster use --endpoints-file", err)
	}
	return c, nil
}
