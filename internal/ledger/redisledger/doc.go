// Package redisledger shares per-pod load across EPP replicas through Redis: the token_load
// decode ledger (each replica publishes its own charges per decode pod and adds the live other
// replicas' charges to its decode scores) and every Signal, such as the request counts
// (running, pending, prefill in flight, drain rate) that least_request, the fast paths and the
// combined overflow check read. Redis is never on the request path: reads happen in the
// background in one pipelined round trip with a short timeout, writes in another, and an outage
// degrades every replica to its local view until Redis answers again. It must not decide
// anything and must never fail a request.
package redisledger
