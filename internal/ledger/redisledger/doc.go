// Package redisledger shares the token_load decode ledger and pd-predictive's booked
// prefill work (package latency's busy-until ledger) across EPP replicas through Redis: each
// replica publishes its own charges per pod and adds the live other replicas' charges to
// its decode scores and predicted prefill waits. Redis is never on the request path: reads happen
// in the background in one pipelined round trip with a short timeout, and an outage
// degrades every replica to its local ledger until Redis answers again. It must not decide
// anything and must never fail a request.
package redisledger
