package config

// FlagDoc documents one epp command-line flag in the reference.
type FlagDoc struct{ Name, Default, Description string }

// LimitFlags are the epp flags that bound what clients can make Tandem hold, and whom it
// trusts to write PD control fields. internal/app declares them with these names, defaults and
// descriptions (its tests check they agree); they are listed here so the reference shows them.
var LimitFlags = []FlagDoc{
	{"max-streams", "4096",
		"Most ext_proc streams (requests in flight through this replica, each until its response ends) open at once; the next request is answered 429 with `Retry-After: 1` at once."},
	{"max-buffered-body-bytes", "201326592",
		"Memory, in bytes, all streams together may hold in request bodies while they arrive; a body chunk that does not fit is answered 503 with `Retry-After: 1` and its body dropped. A body that arrives whole in one message is never refused. Must be at least `--max-body-bytes`."},
	{"request-body-timeout", "1m0s",
		"Longest time a request body may take to arrive after its headers; a slower one is answered 408. `0` disables."},
	{"request-headers-timeout", "10s",
		"Longest time an ext_proc stream may stay open before its request headers arrive (a gateway sends them at once); a silent stream is then closed (`DEADLINE_EXCEEDED`) and its `--max-streams` slot freed. `0` disables."},
	{"max-streams-per-connection", "1024",
		"Most ext_proc streams open at once on one gRPC connection (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`), so one connection cannot take every `--max-streams` slot. A gateway is never throttled by it: Envoy treats a connection at this limit as full and opens another, and its default circuit breaker allows 1024 requests per cluster anyway; other gRPC clients wait for a free stream."},
	{"grpc-keepalive-min-time", "10s",
		"Shortest interval at which a client may send keepalive pings; a client pinging more often is disconnected (`ENHANCE_YOUR_CALM`)."},
	{"grpc-keepalive-time", "1m0s",
		"The ext_proc server pings a connection silent for this long, and closes it when no answer comes within `--grpc-keepalive-timeout` (a peer that vanished frees its streams)."},
	{"grpc-keepalive-timeout", "20s", "How long the server waits for the answer to its keepalive ping before it closes the connection."},
	{"grpc-max-connection-idle", "5m0s",
		"A connection with no open stream for this long is closed (`GOAWAY`); a gateway reconnects on its next request."},
	{"max-body-bytes", "10485760", "Largest request body accepted; a larger one is answered 413."},
	{"trust-client-pd-fields", "false",
		"Forward client-sent PD control fields (`kv_transfer_params`, `disagg_prefill_resp`, `bootstrap_host`/`_port`/`_room`, `disaggregated_params`) instead of removing them. Only for clients that are part of the serving system: these fields name the host a pod connects to."},
}

// Values of --gateway-client and --destination-fallbacks.
const (
	ClientAuto            = "auto"
	ClientFull            = "full"
	ClientDestinationOnly = "destination-only"
	FallbacksAuto         = "auto"
	FallbacksOn           = "on"
	FallbacksOff          = "off"
)

// GatewayClientFlags are the epp flags that say what the gateway calling Tandem can do with
// its answer. internal/app declares them with these names, defaults and descriptions.
var GatewayClientFlags = []FlagDoc{
	{"gateway-client", ClientAuto,
		"What the gateway applies of Tandem's answer. `full`: everything (Envoy-based gateways: header and body mutations, `envoy.lb` metadata, the response phase). `destination-only`: only the `x-gateway-destination-endpoint` header, one `host:port`, and no response phase (NGINX Gateway Fabric's endpoint-picker shim); PD-capable requests are then routed whole to the decode or standard pod, with no prefill leg, and the pod counts as busy for `--destination-only-hold`. `auto`: per stream, a client that sends no pseudo-headers and puts header values in `value` (as that shim does) is taken as `destination-only`, any other as `full`."},
	{"destination-fallbacks", FallbacksAuto,
		"Whether `x-gateway-destination-endpoint` (and its `envoy.lb` metadata, always the same value) lists ranked fallbacks after the primary. `on`: always, `off`: the primary alone, `auto`: the primary alone for destination-only clients (they hand the value to a proxy as one `host:port`), fallbacks for every other client."},
	{"destination-only-hold", "15s",
		"How long a request routed for a destination-only client counts as in flight on its pod (Tandem's own request counts, which least-request and the prefill and decode request terms read, and the token ledgers): such clients never send the response phase, so the end of the ext_proc stream says nothing about the end of the request. What the policies read from the engines' scraped metrics (waiting queues, KV usage, throughput) stays exact at every scrape. `0` releases at the end of the stream."},
}
