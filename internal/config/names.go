package config

import (
	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// Routing strategies the seed and the issue name. The picker's registry is the authority on
// which exist in a build; these are the defaults when it does not say.
const (
	StrategyPD           = "pd"
	StrategyRandom       = "random"
	StrategyLeastRequest = "least-request"
	StrategyPrefixCache  = "prefix-cache"
	// StrategyPDPredictive is the predictive PD chain (issue 18): predicted TTFT and TPOT
	// from online per-pod models, selective disaggregation, SLO-aware overflow and shed.
	StrategyPDPredictive = "pd-predictive"
)

// Prefill and decode score policies, with the seed's names.
const (
	PolicyPrefixCache     = "prefix_cache"
	PolicyLeastRequest    = "least_request"
	PolicyConductor       = "conductor"
	PolicyTokenLoad       = "token_load"
	PolicyHybridCacheLoad = "hybrid_cache_load"
	PolicyLoadBalancing   = "load_balancing"
	PolicyPredictedTTFT   = "predicted_ttft"
	PolicyPredictedTPOT   = "predicted_tpot"
	// PolicyKVCacheUtilization is a decode policy of Tandem's own, not the seed's.
	PolicyKVCacheUtilization = "kv_cache_utilization"
)

// Hand-off modes (TANDEM_PD_HANDOFF, routingConfig.handoff). HandoffAuto, the default, is
// resolved per request by the ext_proc server: sidecar when the decode pod declares a routing
// sidecar, else epp.
const (
	HandoffAuto    = "auto"
	HandoffSidecar = "sidecar"
	HandoffEPP     = "epp"
)

// Transfer-proof policies (TANDEM_PD_TRANSFER_PROOF, routingConfig.transferProof):
// TransferProofLenient, the default, serves every answer and holds out decode pods whose
// transfers keep recomputing; TransferProofStrict also fails each request whose transfer is
// not verified.
const (
	TransferProofLenient = "lenient"
	TransferProofStrict  = "strict"
)

// The headers Tandem reads or writes are named once in package wire; the reference below
// documents them.
const (
	DefaultProfileName        = "default"
	strategyListSeparator     = ", "
	maxReportedAnnotationSize = 256
)

// Names are the valid strategy and policy names. Zero fields take the defaults below.
type Names struct {
	Strategies      []string // routing strategies (the picker registry)
	PrefillPolicies []string // prefill score policies (the PD policy registry)
	DecodePolicies  []string // decode score policies
}

// Documented names with one line each; the configuration reference lists them.
var (
	strategyDocs = []nameDoc{
		{StrategyPD, "prefill/decode-aware selection: the seed's cascade (bucketing, fast paths, scoring, pair selection)"},
		{StrategyRandom, "a random endpoint"},
		{StrategyLeastRequest, "the endpoint with the fewest requests in flight"},
		{StrategyPrefixCache, "the endpoint holding the longest prefix of the prompt, balanced by load"},
		{StrategyPDPredictive, "prefill/decode routing on predicted TTFT and TPOT (online per-pod latency models): pairs by predicted finish, runs cheap prompts whole on decode pods, sends a request to a standard pod when that is predicted cheaper than PD within the TPOT objective, sheds sheddable requests nothing can serve in time"},
	}
	prefillPolicyDocs = []nameDoc{
		{PolicyPrefixCache, "(100 − prefix_match_percent) × 0.1 + req_count / max_req_count"},
		{PolicyLeastRequest, "req_count (prefill requests in flight)"},
		{PolicyConductor, "estimated TTFT: queue + cached-prefix + unmatched-prefill time"},
		{PolicyTokenLoad, "active_tokens + kv_weight × kv_tokens"},
		{PolicyHybridCacheLoad, "token load discounted by the prefix match: load × (1 − r² × factor)"},
		{PolicyPredictedTTFT, "predicted seconds until the prefill leg ends (the pod's booked prefill work + its fitted prefill time of the uncached prompt) ÷ the request's TTFT objective"},
	}
	decodePolicyDocs = []nameDoc{
		{PolicyLoadBalancing, "(w_run × norm_reqs + w_thru × (1 − norm_throughput)) / norm_free_gpu"},
		{PolicyLeastRequest, "running_reqs + pending_decode_count"},
		{PolicyConductor, "estimated TBT from throughput, batch size and GPU pressure"},
		{PolicyTokenLoad, "decode_tokens + generated_tokens"},
		{PolicyPredictedTPOT, "predicted TPOT on the pod ÷ the TPOT objective + predicted KV hand-over ÷ the TTFT objective"},
		{PolicyKVCacheUtilization, "kv_usage_percent + max(running + pending − engine_running, 0) × kv_percent_per_request: the KV in use as last scraped plus the requests sent since, at the pool's mean KV per running request (a pod not scraped: its requests × that mean); equal estimates go to the pod with fewer requests; no fast path"},
	}
)

type nameDoc struct{ Name, Description string }

func docNames(d []nameDoc) []string {
	out := make([]string, len(d))
	for i, n := range d {
		out[i] = n.Name
	}
	return out
}

// DefaultNames are the strategy and policy names the seed documents.
func DefaultNames() Names {
	return Names{
		Strategies:      docNames(strategyDocs),
		PrefillPolicies: docNames(prefillPolicyDocs),
		DecodePolicies:  docNames(decodePolicyDocs),
	}
}

func (n Names) withDefaults() Names {
	d := DefaultNames()
	if len(n.Strategies) == 0 {
		n.Strategies = d.Strategies
	}
	if len(n.PrefillPolicies) == 0 {
		n.PrefillPolicies = d.PrefillPolicies
	}
	if len(n.DecodePolicies) == 0 {
		n.DecodePolicies = d.DecodePolicies
	}
	return n
}

// labelDoc describes a pod label or annotation Tandem reads.
type labelDoc struct{ Name, Kind, Values, Description string }

var labelDocs = []labelDoc{
	{pool.LabelRoleName, "label", "`prefill`, `decode`, other (e.g. `all`)",
		"Phase the pod serves. Any other value, or none, makes a standard pod (set `combined: true` in its routingConfig to use it as a PD fallback)."},
	{pool.LabelRolesetName, "label", "any string",
		"Groups prefill and decode pods into pairs. A roleset with only one side is skipped; pods pair only when their TANDEM_PAIR_MATCH_LABELS values match too (one roleset per revision during a rolling update)."},
	{pool.LabelDisaggRevision, "label", "revision hash", "Set by the DisaggregatedSet controller alike on the prefill and decode pods of one revision; matched by the default TANDEM_PAIR_MATCH_LABELS, so pods of two revisions are never paired (docs/rollouts.md)."},
	{pool.LabelLLMDRole, "label", "`prefill`, `decode`, `prefill-decode`, `both`",
		"llm-d's role label, read when `role-name` is absent so llm-d manifests work unchanged."},
	{pool.LabelModelName, "label", "model name", "The model the pod serves. When a pool holds pods labelled with a request's `model`, the request goes only to those and to pods without the label (a pool may hold several models); a model no pod is labelled with (a LoRA adapter's name) may go to any pod. The model-wide config is read from the pods of the request's model."},
	{pool.LabelModelPort, "label", "port number", "Serving port; defaults to the InferencePool's target port."},
	{pool.LabelEngine, "label", "`vllm` (default), `sglang`, `trtllm`", "Engine of the pod; selects the prefill hand-off wire format."},
	{pool.LabelKVConnector, "label", "`shfs`, `nixl` (any case)", "Per-pod override of AIBRIX_KV_CONNECTOR_TYPE for vLLM pods."},
	{pool.AnnotationConfig, "annotation", "JSON (below)", "Per-model config profiles: strategy, routing config, per-profile overrides."},
	{pool.AnnotationSGLangBootstrapPort, "annotation", "port number (default `8998`)", "SGLang prefill pods: the KV bootstrap port sent to the decode pod."},
}

// headerDoc describes a request or response header Tandem reads or writes.
type headerDoc struct{ Name, Direction, Description string }

var headerDocs = []headerDoc{
	{wire.HeaderRoutingStrategy, "request (read), response (written)",
		"Requests a routing strategy (ignored when the model config sets `lockedRoutingStrategy`); the strategy used is echoed in the response. An unknown name is a 400 listing the valid ones."},
	{wire.HeaderConfigProfile, "request (read)",
		"Selects a profile of the model config; a missing or unknown name uses `defaultProfile`, else `default`. `auto` (any case) picks the most specific profile whose `promptTokensGte`/`promptTokensLt`/`maxTokensGte`/`maxTokensLt` hints match the request, else the default profile."},
	{wire.HeaderAIBrixConfigProfile, "response (written)",
		"The profile `config-profile: auto` resolved to (sent only for `auto`, as AIBrix does), beside the echoed `routing-strategy`."},
	{wire.HeaderSessionKey, "request (read)",
		"Caller-owned session key (≤ 256 bytes) for the token-load session-delta charge."},
	{wire.HeaderDestination, "request (written)",
		"The chosen endpoint and its fallbacks, `ip:port[,ip:port…]`, for the gateway (Endpoint Picker Protocol); the `envoy.lb` metadata carries the same value. The primary alone for clients that take one `host:port` (`--gateway-client`, `--destination-fallbacks`). Client-sent values are removed."},
	{wire.HeaderPrefillerHostPort, "request (written)",
		"The prefill target `ip:port` for a decode-side sidecar (sidecar hand-off). Client-sent values are removed."},
	{wire.HeaderTestSelection, "request (read, conformance mode only)",
		"Restricts the candidates to the listed IPs or `ip:port`s; removed outside conformance mode."},
	{wire.HeaderTestServed, "response (written, conformance mode only)",
		"The endpoint that served the request, as the conformance suite expects."},
	{apierror.HeaderRouting, "response (written)", "`true` on a gateway-generated routing error (bad strategy, no endpoint, a refusal over a limit, an internal error)."},
	{apierror.HeaderPDPrefill, "response (written)", "`true` when the prefill leg of a PD request failed."},
	{apierror.HeaderPDDecode, "response (written)", "`true` when the decode watchdog failed the request (504), or the strict transfer proof did (502: the decode pod's use of the transferred KV was not verified)."},
	{wire.HeaderPDTransfer, "response (written); opt-in",
		"With `TANDEM_PD_TRANSFER_HEADER=true`, the proof of a PD request's KV transfer (`verified`, `recomputed`, `unknown`; `docs/proof.md`), when it is known before the response headers go out."},
	{wire.HeaderSLOTTFT, "request (read)",
		"`pd-predictive`, `predicted_ttft`, `predicted_tpot`: the request's TTFT objective in milliseconds (a positive number up to 1e9, fractions allowed; otherwise a 400 naming the header). Overrides `TANDEM_SLO_TTFT_MS` and the profile's `sloTTFTMs`."},
	{wire.HeaderSLOTPOT, "request (read)",
		"The request's TPOT objective in milliseconds, as `x-slo-ttft-ms`. Overrides `TANDEM_SLO_TPOT_MS` and the profile's `sloTPOTMs`."},
	{wire.HeaderInferenceObjective, "request (read)",
		"`pd-predictive`: the request's InferenceObjective; one with a negative priority makes the request sheddable (429 when no pod is predicted to meet its TTFT objective)."},
	{wire.HeaderTrace, "request (read), response (written); opt-in",
		"When debug tracing is enabled, the decision trace (steps, candidates, scores and `score_direction`: `lower is better` for pd costs and predicted milliseconds, `higher is better` for a scorer chain's totals) as JSON."},
	{"retry-after", "response (written)",
		"`1` on a request refused over a limit (429 `--max-streams`, 503 `--max-buffered-body-bytes`): the same request may succeed shortly."},
	{"x-encoder-hosts-ports", "request (removed)",
		"A target llm-d's routing sidecar connects to (encoder legs): client-sent values are removed, like `x-prefiller-host-port`."},
	{"x-data-parallel-host-port", "request (removed)",
		"A target llm-d's routing sidecar connects to (data-parallel rank): client-sent values are removed."},
}
