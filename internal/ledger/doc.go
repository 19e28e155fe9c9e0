// Package ledger owns the token-load ledgers of the seed's token_load and hybrid_cache_load
// policies: the prefill ledger (active and resident-KV tokens per prefill pod), the decode
// ledger (prompt tokens and output growth per decode pod), the session table of the
// session-delta charge, the janitor that force-releases leaked charges and forgets idle
// pods, and the gauges hook. Pods are keyed by namespace/name. It reads an injectable clock
// and never selects pods or talks to the network: policies score from it, a shared store
// (redisledger) may add other replicas' charges through the Remote interface.
package ledger
