package picker

import (
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Resolved is what configuration says about one request (internal/config works it out:
// strategy precedence, profile, PD knobs with the profile's overrides).
type Resolved = config.Resolved

// Resolver turns a request's headers and model into a Resolved configuration and reads
// per-pod routing configuration. *config.Resolver implements it.
type Resolver interface {
	// ResolveRequest resolves with the request features config-profile: auto reads.
	ResolveRequest(headers map[string]string, model string, snap *pool.Snapshot, f config.Features) (Resolved, error)
	// PodRouting is the routingConfig the endpoint declares for the profile (its default
	// profile when it has no such profile; zero when it declares nothing).
	PodRouting(e *pool.Endpoint, profile string) config.RoutingConfig
}

var _ Resolver = (*config.Resolver)(nil)
