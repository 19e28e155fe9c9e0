// Package pd owns the prefill/decode selection cascade, the seed's "Pod Selection
// Algorithm": rolesets and combined pods, prompt-length bucketing, the load-imbalance fast
// paths, the prefill and decode score policies (registries, so new policies plug in), pair
// selection, and the gateway-side trackers they read (prefill requests in flight, pending
// decodes). It must not speak gRPC or engine wire formats: it returns a picker.Decision.
package pd
