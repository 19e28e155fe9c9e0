// Package sim owns simulated model servers (vLLM, SGLang, TensorRT-LLM) for tests, the demo and
// benchmarks: the OpenAI APIs, each engine's metrics and PD wire contract, an engine model (an
// iteration-level scheduler, Batch, shared with bench/quality's virtual-time engine, and a
// roofline cost model with calibrated profiles), faults and a request recorder. It must never be
// imported by production packages.
package sim
