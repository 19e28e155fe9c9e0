package gateway

// Names of the Endpoint Picker Protocol (GIE proposal 004), as a gateway sees them.
const (
	// destinationNamespace is the dynamic-metadata namespace in which the EPP names the
	// destination, and in which the gateway reports the endpoint that served.
	destinationNamespace = "envoy.lb"
	// destinationKey is both the request header and the metadata key carrying
	// "ip:port[,ip:port...]": the primary endpoint first, then fallbacks in order.
	destinationKey = "x-gateway-destination-endpoint"
	// servedKey reports, on the response-headers message, the endpoint that actually served.
	servedKey = "x-gateway-destination-endpoint-served"
	// subsetNamespace and subsetKey carry the optional subset hint on the request headers
	// message: a list of "ip[:port]" the EPP must pick from.
	subsetNamespace = "envoy.lb.subset_hint"
	subsetKey       = "x-gateway-destination-endpoint-subset"
)

// chunkSize bounds one body read, so bodies reach the EPP in pieces as Envoy sends them.
const chunkSize = 32 << 10
