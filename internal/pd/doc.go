// Package pd owns prefill/decode selection as picker plugins: the seed's "Pod Selection
// Algorithm" (the roleset handler with its deciders — step 0b combined overflow, step 1
// prefill imbalance, step 2 decode imbalance — the role, prompt-length bucket and
// standard-deviation filters, and the prefill and decode score policies as scorers; the
// built-in pd strategy is NewDefaultChain), llm-d's disagg-profile-handler and PD deciders,
// the policy registries, and the gateway-side trackers every PD pick reads (prefill requests
// in flight, pending decodes) with the critical section that guards them, and the
// topology-aware preference for near pairs (TANDEM_TOPOLOGY_LABELS, topology.go). It must
// not speak gRPC or engine wire formats: it returns a picker.Decision.
//
// # Adding a score policy or a decider
//
// One file and one table test each, plus one line elsewhere: CONTRIBUTING.md has the recipe.
package pd
