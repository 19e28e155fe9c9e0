package extproc

// Names the Endpoint Picker Protocol (GIE v1.6.0, proposal 004) and its conformance suite put
// on the wire. Each is defined once here, with the spec's meaning.
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

	// HeaderPrefillerHostPort names the prefill target for a decode-side sidecar (llm-d).
	// A client must never choose it: it would let callers aim the sidecar anywhere (SSRF).
	HeaderPrefillerHostPort = "x-prefiller-host-port"
	// MetadataKeyPrefiller carries the same prefill target in MetadataNamespaceLB (sidecar
	// hand-off), for decode-side proxies that read dynamic metadata.
	MetadataKeyPrefiller = "x-prefiller-host-port"
	// HeaderTrace carries the decision trace (JSON) on the response when Options.DebugTraceHeader is set.
	HeaderTrace = "x-tandem-trace"

	// maxChunkBytes bounds each streamed body chunk Tandem sends: some gateways cap a chunk at
	// 64 KiB, so stay below it with a margin.
	maxChunkBytes = 62000
)
