// Package handoff owns the "epp" PD hand-off: Tandem itself sends the prefill leg to the prefill
// pod and rewrites the body the gateway forwards to the decode pod, per engine (vLLM
// kv_transfer_params, SGLang bootstrap_*, TensorRT-LLM disaggregated_params), plus the failure
// machinery around it: prefill failure classes, SGLang /abort_request (to the decode pod on a
// failure, to the prefill pod when a request ends before its first token), the measured hold of
// a finished prefill leg's KV, and the decode watchdog.
// It must not pick endpoints or speak ext_proc; the caller hands it a chosen pair and drives it.
package handoff
