// Package sim owns simulated model servers (vLLM, SGLang, TensorRT-LLM) for tests, the demo and
// benchmarks: the OpenAI APIs, each engine's metrics and PD wire contract, a latency model, faults
// and a request recorder. It must never be imported by production packages.
package sim
