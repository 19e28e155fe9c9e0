//go:build nokube

package app

import (
	"context"
	"errors"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/objective"
	"github.com/tandem-epp/tandem/internal/pool"
)

// RestConfig stands for the Kubernetes client configuration, which a binary built with
// -tags nokube cannot use.
type RestConfig = struct{}

func setKubeLogger(logr.Logger) {}

// ErrNoKube is the answer of a binary built without Kubernetes support to a pool that is not
// an endpoints file.
var ErrNoKube = errors.New("this epp was built without Kubernetes support (-tags nokube): give the pool with --endpoints-file, or use a build without that tag to follow an InferencePool")

func kubeSource(*Options, Env, *pool.Store, pool.PairMatch, *objective.Set, *tel, logr.Logger) (func(context.Context) error, error) {
	return nil, ErrNoKube
}
