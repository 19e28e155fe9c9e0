// Package latency owns Tandem's online latency models, one per endpoint, fitted from what
// the gateway observes (package outcome's events and the engines' scraped samples), never
// from an engine's own cost function:
//
//   - prefill seconds of a prompt as a function of its uncached tokens (recursive least
//     squares with forgetting on a base, a linear and an attention term);
//   - a busy-until ledger of prefill work per pod, charged at pick time with the predicted
//     seconds and corrected by the actual ends of the legs, so the wait of the next prompt
//     is known before any metric is scraped; the wait for work others routed there (the
//     engine's waiting requests and its queue-time histogram beyond what the ledger holds);
//   - the hand-over of a prefill to its decode pod (KV transfer and the first decode step)
//     as a function of prompt tokens, and what each distance class of the pair (same node,
//     NVLink domain, zone, …) adds to it per token;
//   - the decode step as a function of the requests and the KV tokens resident on the pod,
//     fitted on inter-chunk gaps with the prefill work that shared the pod's iterations
//     taken out (until the first such stream, on the engine's inter-token histogram), and
//     the TPOT a request would see with a given prefill load on the pod;
//   - the progress of the streams answering on each pod (every response chunk): a pod whose
//     streams all fall silent for much longer than their usual chunk gap is stalled, and its
//     predicted wait holds the stall, before any request on it ends;
//   - the error of each TTFT prediction against the observed first byte.
//
// Every pod starts from Defaults and learns its own coefficients, so heterogeneous pools
// work. It must not choose endpoints (package pd's predictive policies read it) nor speak
// to the network (a shared store adds other replicas' charges through Remote).
package latency
