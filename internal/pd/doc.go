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
// # Adding a score policy
//
// A policy is one file and one table test:
//
//  1. policy_<name>.go: a type implementing PrefillPolicy (Name, UsesPrefix, Score) or
//     DecodePolicy (Name, ColdStart, FastPath, Score) — lower is better, in the policy's own
//     units, NaN for a pod it cannot score — registered with
//     `var _ = builtinPrefillPolicy(myPolicy{})` (or builtinDecodePolicy). A policy that keeps
//     a ledger also implements CycleCharger (charged inside the critical section, released by
//     the decision's lifecycle).
//  2. policy_<name>_test.go: a table of PrefillBatch/DecodeBatch inputs and the scores worked
//     out by hand.
//
// One line elsewhere: its name and score formula in internal/config's prefillPolicyDocs (or
// decodePolicyDocs). The variables' accepted values, the generated reference and the chart's
// schema are made from that list, so AIBRIX_PREFILL_SCORE_POLICY refuses a name missing there
// ("must be one of …"); regenerate them with `go generate ./internal/config` and
// `go test ./manifests/ -run TestChartSettings -update`. Nothing else changes: the policy is
// accepted by name in AIBRIX_PREFILL_SCORE_POLICY /
// AIBRIX_DECODE_SCORE_POLICY, in a model config's prefillScorePolicy / decodeScorePolicy, and
// in a --config-file's prefill-policy-scorer or decode-policy-scorer (parameter policy), and
// the roleset handler pairs on its raw score exactly as on the seed's own. A policy that needs
// the process's state (the token-load ledgers) is registered on the cascade instead
// (Cascade.Policies().RegisterPrefill), as RegisterTokenLoad does.
package pd
