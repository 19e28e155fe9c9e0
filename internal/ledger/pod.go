package ledger

import (
	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Pod identifies a pod by namespace and name. Every port (data-parallel rank) of a pod shares
// one ledger entry, and equal pod names in different namespaces stay apart.
type Pod struct {
	Namespace, Name string
}

// PodOf returns the pod of an endpoint.
func PodOf(e *pool.Endpoint) Pod { return Pod{Namespace: e.Namespace, Name: e.Name} }

// String is "namespace/name".
func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// Gauges publishes the ledgers as the seed's gauges pd_token_load_active_tokens,
// pd_token_load_kv_tokens and pd_token_load_decode_tokens {namespace, pod_name}.
// *telemetry.Metrics implements it.
type Gauges interface {
	SetTokenLoad(namespace, pod string, active, kv float64)
	SetDecodeTokens(namespace, pod string, tokens float64)
	// DeleteTokenLoad drops every ledger series of the pod (the janitor forgot it).
	DeleteTokenLoad(namespace, pod string)
}

type nopGauges struct{}

func (nopGauges) SetTokenLoad(string, string, float64, float64) {}
func (nopGauges) SetDecodeTokens(string, string, float64)       {}
func (nopGauges) DeleteTokenLoad(string, string)                {}

// Options configure a ledger.
type Options struct {
	Clock  load.Clock  // nil: the system clock
	Gauges Gauges      // nil: no gauges
	Logger logr.Logger // force-releases and a full session table are logged here
}

func (o Options) withDefaults() Options {
	if o.Clock == nil {
		o.Clock = load.SystemClock{}
	}
	if o.Gauges == nil {
		o.Gauges = nopGauges{}
	}
	return o
}
