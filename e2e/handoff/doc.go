// Package handoffe2e holds the end-to-end tests of the "epp" prefill/decode hand-off (issue 7):
// real HTTP clients talk to the local gateway (internal/gateway), which asks Tandem
// (internal/app, in-process) over a real ext_proc stream and proxies to simulated vLLM, SGLang
// and TensorRT-LLM pods (internal/sim) that validate and record every leg, all on 127.0.0.1.
// It has tests only; it must not be imported, and it must not mock what runs here for real.
package handoffe2e
