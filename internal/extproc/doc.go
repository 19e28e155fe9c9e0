// Package extproc owns the Endpoint Picker Protocol over Envoy ext_proc: the per-stream
// state machine (headers → body chunks → decide → answers → response pass-through), the
// candidate set (subset hint, conformance test selection), header hygiene, rendering
// request-level errors as ImmediateResponses, and driving a PD decision's hand-off: in
// sidecar mode it names the prefill pod (x-prefiller-host-port header and envoy.lb metadata);
// in epp mode it runs the prefill leg through internal/handoff, forwards the rewritten decode
// body, and watches the decode leg (prefill failures, decode watchdog, client cancel). In both
// modes it judges a PD request's KV transfer from the decode answer as it passes (the proof,
// internal/proof) and, under the strict policy, fails a request whose transfer is not
// verified. It also keeps one client from hurting the others: admission limits (open streams,
// a shared budget of buffered request-body bytes, the time a body may take) answered at once,
// and a panic on a stream recovered into that request's 500 or reset. It must not schedule (picker does), build
// engine bodies (handoff does) nor listen on sockets (serving does).
package extproc
