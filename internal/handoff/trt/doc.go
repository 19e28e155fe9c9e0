// Package trt owns the two TensorRT-LLM facts the hand-off needs besides body shapes: the
// Snowflake disagg_request_id generator and the cached /server_info lookup of context workers
// (generation_first). It must not build request bodies or send inference requests.
package trt
