// Package wire names, once, every string Tandem puts on or reads from the wire: request and
// response headers, the Endpoint Picker Protocol's dynamic-metadata namespaces and keys, and
// the request-body fields the engine hand-offs read and write. It holds names only (no
// behaviour, no imports), so every package may import it; the configuration reference is
// generated from it. Each comment says what the name means in the spec that defines it.
package wire

// The Endpoint Picker Protocol (GIE v1.6.0, proposal 004) and its conformance suite.
const (
	// HeaderDestination is the request header the gateway routes on: "ip:port[,ip:port…]",
	// the primary endpoint first, then fallbacks in the order the gateway should try them.
	HeaderDestination = "x-gateway-destination-endpoint"
	// MetadataNamespaceLB is the dynamic-metadata namespace carrying the destination to the
	// gateway, and the served endpoint back from it.
	MetadataNamespaceLB = "envoy.lb"
	// MetadataKeyDestination holds the same value as HeaderDestination in MetadataNamespaceLB.
	MetadataKeyDestination = "x-gateway-destination-endpoint"
	// MetadataKeyServed is where the gateway reports, on the response messages, the endpoint
	// that actually served the request.
	MetadataKeyServed = "x-gateway-destination-endpoint-served"
	// MetadataNamespaceSubset and MetadataKeySubset carry the gateway's subset hint: a list (or
	// comma-separated string) of "ip" or "ip:port" the pick must come from.
	MetadataNamespaceSubset = "envoy.lb.subset_hint"
	MetadataKeySubset       = "x-gateway-destination-endpoint-subset"

	// HeaderTestSelection is the conformance suite's request header steering the pick:
	// comma-separated "ip" (any port of that pod) or "ip:port" (that port only).
	HeaderTestSelection = "test-epp-endpoint-selection"
	// HeaderTestServed is the response header the conformance suite reads the served endpoint from.
	HeaderTestServed = "x-conformance-test-served-endpoint"
	// HeaderEchoSetHeader asks the conformance suite's echo backend to copy a header into its
	// response ("name:value"); lwepp sets it so the served header exists even on gateways
	// that do not send response headers to the EPP.
	HeaderEchoSetHeader = "x-echo-set-header"
)

// Disaggregated serving: what a decode-side sidecar (llm-d's routing sidecar) reads.
const (
	// HeaderPrefillerHostPort names the prefill target "ip:port" for a decode-side sidecar.
	// A client must never choose it: it would let callers aim the sidecar anywhere (SSRF).
	HeaderPrefillerHostPort = "x-prefiller-host-port"
	// MetadataKeyPrefiller carries the same prefill target in MetadataNamespaceLB (sidecar
	// hand-off), for decode-side proxies that read dynamic metadata.
	MetadataKeyPrefiller = "x-prefiller-host-port"
	// HeaderEncoderHostsPorts names llm-d's encode targets (E/P/D) and
	// HeaderDataParallelHostPort its data-parallel leg: the sidecar connects to the hosts they
	// name, so Tandem never sets them and removes a client's.
	HeaderEncoderHostsPorts    = "x-encoder-hosts-ports"
	HeaderDataParallelHostPort = "x-data-parallel-host-port"
)

// Headers of Tandem's own routing contract (the seed's names, and Tandem's trace).
const (
	// HeaderRoutingStrategy requests a routing strategy; the response echoes the one used.
	HeaderRoutingStrategy = "routing-strategy"
	// HeaderConfigProfile selects a profile of the model's model.aibrix.ai/config.
	HeaderConfigProfile = "config-profile"
	// HeaderAIBrixConfigProfile echoes, on the response, the profile config-profile: auto chose.
	HeaderAIBrixConfigProfile = "x-aibrix-config-profile"
	// HeaderSessionKey is the caller-owned session key of the token-load session-delta rule.
	HeaderSessionKey = "x-aibrix-session-key"
	// HeaderTrace carries the decision trace (JSON) on the response when debug tracing is on.
	HeaderTrace = "x-tandem-trace"
	// HeaderPDTransfer carries the proof of a PD request's KV transfer ("verified",
	// "recomputed", "unknown") on the response, when TANDEM_PD_TRANSFER_HEADER is on and the
	// proof is known before the response headers go out.
	HeaderPDTransfer = "x-tandem-pd-transfer"
	// HeaderRequestID is the request ID gateways (Envoy) set; Tandem logs it and passes it to
	// the engines' prefill legs.
	HeaderRequestID = "x-request-id"
	// HeaderContentLength is HTTP's; Tandem rewrites it when it replaces the body.
	HeaderContentLength = "content-length"
)

// Latency objectives of one request (llm-d's predicted-latency routing names them so), and
// the GIE InferenceObjective it belongs to.
const (
	// HeaderSLOTTFT is the request's time-to-first-token objective, in milliseconds.
	HeaderSLOTTFT = "x-slo-ttft-ms"
	// HeaderSLOTPOT is the request's time-per-output-token objective, in milliseconds.
	HeaderSLOTPOT = "x-slo-tpot-ms"
	// HeaderInferenceObjective names the InferenceObjective of the request (GIE); one with a
	// negative priority marks the request sheddable.
	HeaderInferenceObjective = "x-gateway-inference-objective"
)

// OpenAI request-body fields Tandem reads or rewrites for a prefill leg.
const (
	FieldModel               = "model"
	FieldPrompt              = "prompt"
	FieldMessages            = "messages"
	FieldStream              = "stream"
	FieldStreamOptions       = "stream_options"
	FieldMaxTokens           = "max_tokens"
	FieldMaxCompletionTokens = "max_completion_tokens"
	// FieldMaxOutputTokens, FieldStore and FieldBackground are the Responses API's output
	// limit and the two fields that keep a response after it is answered.
	FieldMaxOutputTokens = "max_output_tokens"
	FieldStore           = "store"
	FieldBackground      = "background"
	// FieldMinTokens is vLLM's extension; a prefill leg that must stop after one token drops it.
	FieldMinTokens = "min_tokens"
)

// vLLM's disaggregated prefill (the NIXL and SHFS KV connectors).
const (
	// FieldKVTransferParams is the connector's hand-off object: the prefill leg sends
	// do_remote_decode, its answer carries the KV location the decode leg sends back.
	FieldKVTransferParams = "kv_transfer_params"
	// FieldRemoteHost is the prefill host inside kv_transfer_params.
	FieldRemoteHost = "remote_host"
	// FieldDisaggPrefillResp is the SHFS connector's field carrying the whole prefill answer.
	FieldDisaggPrefillResp = "disagg_prefill_resp"
)

// SGLang's disaggregation (the bootstrap server of the prefill pod).
const (
	FieldBootstrapHost = "bootstrap_host"
	FieldBootstrapPort = "bootstrap_port"
	FieldBootstrapRoom = "bootstrap_room"
	// FieldRID is SGLang's request ID, the same on both legs of one request.
	FieldRID = "rid"
)

// TensorRT-LLM's disaggregated serving.
const (
	// FieldDisaggregatedParams carries request_type (context_only / generation_only) and the
	// context phase's result to the generation phase.
	FieldDisaggregatedParams = "disaggregated_params"
	FieldRequestType         = "request_type"
	// FieldPromptTokenIDs is the tokenized prompt the context phase returns.
	FieldPromptTokenIDs = "prompt_token_ids"
)
