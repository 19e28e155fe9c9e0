package main

import (
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/pool"
)

// newTandem builds Tandem's ext_proc server over a store holding the same endpoints, with the
// production default scheduler: the body is parsed and every endpoint scored on each request.
func newTandem(n int) extprocv3.ExternalProcessorServer {
	store := pool.NewStore()
	eps := make([]*pool.Endpoint, n)
	for i := range eps {
		eps[i] = pool.NewEndpoint("bench", fmt.Sprintf("pod-%d", i), benchIP(i), 8000, 0,
			map[string]string{"app": "bench"}, nil)
	}
	store.Publish(pool.Info{Name: "bench", Namespace: "bench", TargetPorts: []int32{8000}}, eps, true)
	return extproc.NewServer(store, newScheduler(store), extproc.Options{})
}
