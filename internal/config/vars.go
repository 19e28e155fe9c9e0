package config

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Var is one gateway setting. The same definition drives the environment variable, the key of
// the --config-file gateway: section, the routingConfig.pd override (when ProfileKey is set),
// validation and the generated reference, so none of them can list a setting the others lack.
type Var struct {
	Name        string // environment variable, e.g. AIBRIX_TOKEN_LOAD_KV_WEIGHT
	Key         string // key in the config file's gateway: section
	ProfileKey  string // field of routingConfig.pd overriding it per profile; "" when gateway-only
	Type        string // what a value looks like, for the reference ("boolean", "seconds", …)
	Rule        string // validity rule, worded as the error states it ("must be positive")
	Description string
	// KeepDefault: an invalid value is a warning that keeps the default, not an error (the seed
	// says so for AIBRIX_BUCKET_SERVE_MODE and AIBRIX_TRT_SCHEDULE_STYLE).
	KeepDefault bool
	// AnyCase: an enum matched in any case (Type "one of …"), as AIBrix matches it.
	AnyCase bool

	// set parses raw into g; it returns "" or the reason raw is invalid.
	set    func(g *Gateway, raw string) string
	format func(g *Gateway) string
}

// Default is the variable's default, as it would be written in the environment.
func (v *Var) Default() string {
	d := DefaultGateway()
	return v.format(&d)
}

// Value is the variable's value in g, as it would be written in the environment.
func (v *Var) Value(g *Gateway) string { return v.format(g) }

// numRule is a range check with the words an error uses for it.
type numRule struct {
	text string
	ok   func(float64) bool
}

var (
	positive    = numRule{"must be positive", func(x float64) bool { return x > 0 }}
	nonNegative = numRule{"must be 0 or more", func(x float64) bool { return x >= 0 }}
	offOrPos    = numRule{"must be 0 (disabled) or positive", func(x float64) bool { return x >= 0 }}
	unitRange   = numRule{"must be 0 to 1", func(x float64) bool { return x >= 0 && x <= 1 }}
	pctRange    = numRule{"must be 0 to 100", func(x float64) bool { return x >= 0 && x <= 100 }}
	machineID   = numRule{"must be in [0, 1024)", func(x float64) bool { return x >= 0 && x < 1024 }}
)

func parseNumber(raw string, whole bool) (float64, bool) {
	raw = strings.TrimSpace(raw)
	if whole {
		n, err := strconv.ParseInt(raw, 10, 64)
		return float64(n), err == nil
	}
	f, err := strconv.ParseFloat(raw, 64)
	return f, err == nil && !math.IsNaN(f) && !math.IsInf(f, 0)
}

func numberVar(name, key, profileKey, typ string, whole bool, r numRule, desc string,
	set func(*Gateway, float64), get func(*Gateway) float64) Var {
	return boundedVar(name, key, profileKey, typ, whole, math.MaxFloat64, r, desc, set, get)
}

// boundedVar is numberVar with an upper limit beyond which the value does not fit its field.
func boundedVar(name, key, profileKey, typ string, whole bool, limit float64, r numRule, desc string,
	set func(*Gateway, float64), get func(*Gateway) float64) Var {
	notNumber := "must be a number"
	if whole {
		notNumber = "must be a whole number"
	}
	return Var{
		Name: name, Key: key, ProfileKey: profileKey, Type: typ, Rule: r.text, Description: desc,
		set: func(g *Gateway, raw string) string {
			x, ok := parseNumber(raw, whole)
			if !ok {
				return notNumber
			}
			if !r.ok(x) {
				return r.text
			}
			if x > limit {
				return "is too large"
			}
			set(g, x)
			return ""
		},
		format: func(g *Gateway) string { return strconv.FormatFloat(get(g), 'f', -1, 64) },
	}
}

func floatVar(name, key, profileKey string, r numRule, desc string, f func(*Gateway) *float64) Var {
	return numberVar(name, key, profileKey, "number", false, r, desc,
		func(g *Gateway, x float64) { *f(g) = x }, func(g *Gateway) float64 { return *f(g) })
}

func intVar(name, key, profileKey string, r numRule, desc string, f func(*Gateway) *int) Var {
	return numberVar(name, key, profileKey, "integer", true, r, desc,
		func(g *Gateway, x float64) { *f(g) = int(x) }, func(g *Gateway) float64 { return float64(*f(g)) })
}

// durationVar reads a whole number of units (seconds, minutes, milliseconds), as the seed writes them.
func durationVar(name, key, profileKey string, unit time.Duration, r numRule, desc string, f func(*Gateway) *time.Duration) Var {
	typ := map[time.Duration]string{time.Second: "seconds", time.Minute: "minutes", time.Millisecond: "milliseconds"}[unit]
	return boundedVar(name, key, profileKey, typ, true, float64(math.MaxInt64/int64(unit)), r, desc,
		func(g *Gateway, x float64) { *f(g) = time.Duration(x) * unit },
		func(g *Gateway) float64 { return float64(*f(g) / unit) })
}

func boolVar(name, key, desc string, f func(*Gateway) *bool) Var {
	return Var{
		Name: name, Key: key, Type: "boolean", Rule: "must be true or false", Description: desc,
		set: func(g *Gateway, raw string) string {
			b, err := strconv.ParseBool(strings.TrimSpace(raw))
			if err != nil {
				return "must be true or false"
			}
			*f(g) = b
			return ""
		},
		format: func(g *Gateway) string { return strconv.FormatBool(*f(g)) },
	}
}

func oneOf(values []string) string { return "must be one of " + strings.Join(values, ", ") }

// matchEnum returns the value of values raw names (trimmed; in any case when c is AnyCase).
func matchEnum(raw string, values []string, c Case) (string, bool) {
	raw = strings.TrimSpace(raw)
	if c == AnyCase {
		raw = strings.ToLower(raw)
	}
	if !slices.Contains(values, raw) {
		return "", false
	}
	return raw, true
}

// Case says whether an enum setting matches its values exactly or in any case.
type Case bool

const (
	Exact   Case = false // AIBrix compares the value as written
	AnyCase Case = true  // AIBrix lower-cases the value first (it is stored lower-cased)
)

// enumVar accepts one of values, in any case when c is AnyCase. With keepDefault an unknown
// value is reported as a warning and the default stays.
func enumVar(name, key string, values []string, keepDefault bool, c Case, desc string, f func(*Gateway) *string) Var {
	rule := oneOf(values)
	if c == AnyCase {
		desc += " Matched in any case, as AIBrix does."
	}
	return Var{
		Name: name, Key: key, Type: "one of " + strings.Join(values, ", "), Rule: rule, Description: desc,
		KeepDefault: keepDefault, AnyCase: c == AnyCase,
		set: func(g *Gateway, raw string) string {
			v, ok := matchEnum(raw, values, c)
			if !ok {
				return rule
			}
			*f(g) = v
			return ""
		},
		format: func(g *Gateway) string { return *f(g) },
	}
}

// engineListVar accepts a comma-separated list of Engines (each once, in any order; spaces
// ignored).
func engineListVar(name, key, profileKey, desc string, f func(*Gateway) *EngineSet) Var {
	rule := "must be a comma-separated list of " + strings.Join(Engines, ", ")
	return Var{
		Name: name, Key: key, ProfileKey: profileKey, Type: "list of " + strings.Join(Engines, ", "), Rule: rule, Description: desc,
		set: func(g *Gateway, raw string) string {
			var set EngineSet
			for _, part := range strings.Split(raw, ",") {
				v, ok := matchEnum(part, Engines, Exact)
				if !ok || set.Has(v) {
					return rule
				}
				set |= EngineSetOf(v)
			}
			*f(g) = set
			return ""
		},
		format: func(g *Gateway) string { return f(g).String() },
	}
}

// topologyVar accepts a label-key list (parseLabelKeys) of at most MaxTopologyLabels keys,
// nearest first, or "none".
func topologyVar(name, key, desc string, f func(*Gateway) *TopologyLabels) Var {
	const rule = "must be none or 1 to 4 distinct comma-separated label keys, nearest first, e.g. kubernetes.io/hostname,topology.kubernetes.io/zone"
	return Var{
		Name: name, Key: key, Type: "list of label keys, or none", Rule: rule, Description: desc,
		set: func(g *Gateway, raw string) string {
			keys, why := parseLabelKeys(raw, MaxTopologyLabels)
			if why != "" {
				return rule + " (" + why + ")"
			}
			t, _ := NewTopologyLabels(keys...) // parseLabelKeys checked what it checks
			*f(g) = t
			return ""
		},
		format: func(g *Gateway) string { return f(g).String() },
	}
}

// NoLabels is the value of a label-key list setting that names no label.
const NoLabels = "none"

// parseLabelKeys reads a label-key list setting: NoLabels, or comma-separated pod label keys
// (spaces around them ignored), each a valid Kubernetes label key, each once, at most max of
// them (0: any number). why names what is wrong ("" when nothing is).
func parseLabelKeys(raw string, max int) (keys []string, why string) {
	raw = strings.TrimSpace(raw)
	if raw == NoLabels {
		return nil, ""
	}
	for _, part := range strings.Split(raw, ",") {
		k := strings.TrimSpace(part)
		switch {
		case k == "":
			return nil, "an empty key: two commas in a row, or one at an end"
		case len(validation.IsQualifiedName(k)) > 0:
			return nil, fmt.Sprintf("%q is not a label key: %s", k, validation.IsQualifiedName(k)[0])
		case slices.Contains(keys, k):
			return nil, fmt.Sprintf("%q is named twice", k)
		}
		keys = append(keys, k)
	}
	if max > 0 && len(keys) > max {
		return nil, fmt.Sprintf("%d keys, at most %d", len(keys), max)
	}
	return keys, ""
}

// strategyVar accepts any strategy name; the picker registry checks it when the resolver is built.
func strategyVar(name, key, desc string, f func(*Gateway) *string) Var {
	const rule = "must name a registered routing strategy"
	return Var{
		Name: name, Key: key, Type: "strategy name", Rule: rule, Description: desc,
		set: func(g *Gateway, raw string) string {
			raw = strings.ToLower(strings.TrimSpace(raw))
			if raw == "" || strings.ContainsAny(raw, " \t,") {
				return rule
			}
			*f(g) = raw
			return ""
		},
		format: func(g *Gateway) string { return *f(g) },
	}
}

// labelListVar accepts a label-key list (parseLabelKeys), or NoLabels for the empty list; it
// keeps them comma-joined, without spaces.
func labelListVar(name, key, desc string, f func(*Gateway) *string) Var {
	const rule = "must be a comma-separated list of label keys (such as " + pool.LabelDisaggRevision + "), or none"
	return Var{
		Name: name, Key: key, Type: "list of label keys, or none", Rule: rule, Description: desc,
		set: func(g *Gateway, raw string) string {
			keys, why := parseLabelKeys(raw, 0)
			if why != "" {
				return rule + " (" + why + ")"
			}
			*f(g) = strings.Join(keys, ",")
			return ""
		},
		format: func(g *Gateway) string {
			if *f(g) == "" {
				return NoLabels
			}
			return *f(g)
		},
	}
}

// Vars is every gateway setting, in the order the reference lists them.
var Vars = []Var{
	boolVar("AIBRIX_PROMPT_LENGTH_BUCKETING", "promptLengthBucketing",
		"Enable prompt-length bucket matching for prefill, decode, and standard inference pods.",
		func(g *Gateway) *bool { return &g.PD.PromptLengthBucketing }),
	boolVar("AIBRIX_BUCKET_SERVE", "bucketServe",
		"Enable adaptive bucket serving on top of prompt-length bucketing (requires AIBRIX_PROMPT_LENGTH_BUCKETING=true).",
		func(g *Gateway) *bool { return &g.PD.BucketServe }),
	enumVar("AIBRIX_BUCKET_SERVE_MODE", "bucketServeMode", []string{"throughput", "rps"}, true, AnyCase,
		"Objective of the adaptive cut points: `throughput` (prompt token mass) or `rps` (request counts). An unknown value keeps the default.",
		func(g *Gateway) *string { return &g.PD.BucketServeMode }),
	durationVar("AIBRIX_PREFILL_REQUEST_TIMEOUT", "prefillRequestTimeout", "prefillRequestTimeout", time.Second, positive,
		"Seconds before a prefill request to a prefill pod times out.",
		func(g *Gateway) *time.Duration { return &g.PD.PrefillRequestTimeout }),
	enumVar("AIBRIX_PREFILL_SCORE_POLICY", "prefillScorePolicy", docNames(prefillPolicyDocs), false, Exact,
		"Default scoring policy for selecting prefill pods.",
		func(g *Gateway) *string { return &g.PD.PrefillScorePolicy }),
	floatVar("AIBRIX_TOKEN_LOAD_KV_WEIGHT", "tokenLoadKVWeight", "tokenLoadKVWeight", positive,
		"`token_load` and `hybrid_cache_load`. Weight of resident KV tokens in the prefill score.",
		func(g *Gateway) *float64 { return &g.PD.TokenLoadKVWeight }),
	floatVar("AIBRIX_TOKEN_LOAD_REQUEST_COST", "tokenLoadRequestCost", "tokenLoadRequestCost", positive,
		"`token_load` and `hybrid_cache_load`. Fixed per-request cost, in tokens, added to every prefill charge.",
		func(g *Gateway) *float64 { return &g.PD.TokenLoadRequestCost }),
	durationVar("AIBRIX_TOKEN_LOAD_TTL_SECONDS", "tokenLoadTTLSeconds", "tokenLoadTTLSeconds", time.Second, positive,
		"`token_load` and `hybrid_cache_load`. Charges older than this are force-released and logged; must exceed the longest legitimate request.",
		func(g *Gateway) *time.Duration { return &g.PD.TokenLoadTTL }),
	durationVar("AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS", "tokenLoadSessionTTLSeconds", "tokenLoadSessionTTLSeconds", time.Second, offOrPos,
		"`token_load` and `hybrid_cache_load`. How long the last prompt size of an `x-aibrix-session-key` session is remembered for the session-delta charge. `0` turns the session-delta rule off.",
		func(g *Gateway) *time.Duration { return &g.PD.TokenLoadSessionTTL }),
	intVar("AIBRIX_TOKEN_LOAD_MAX_SESSIONS", "tokenLoadMaxSessions", "", positive,
		"`token_load` and `hybrid_cache_load`. Maximum number of sessions remembered at once for the session-delta charge (gateway-wide only).",
		func(g *Gateway) *int { return &g.PD.TokenLoadMaxSessions }),
	floatVar("AIBRIX_HYBRID_CACHE_LOAD_FACTOR", "hybridCacheLoadFactor", "hybridCacheLoadFactor", unitRange,
		"`hybrid_cache_load` only. Discount a full prefix match applies to a pod's token load. `1` makes a fully matched pod always win; `0` turns the discount off.",
		func(g *Gateway) *float64 { return &g.PD.HybridCacheLoadFactor }),
	floatVar("AIBRIX_MIN_MATCH_PCT", "minMatchPct", "minMatchPct", pctRange,
		"`prefix_cache` and `hybrid_cache_load`. Prefix matches below this percentage are ignored. `0` disables the threshold.",
		func(g *Gateway) *float64 { return &g.PD.MinMatchPct }),
	boolVar("AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH", "decodeTokenLoadOutputGrowth",
		"`token_load` decode policy only. Adds an estimate of the output generated so far to the decode score. `false` scores prompt tokens only.",
		func(g *Gateway) *bool { return &g.PD.DecodeTokenLoadOutputGrowth }),
	boolVar("AIBRIX_TOKEN_LOAD_SHARED_LEDGER", "tokenLoadSharedLedger",
		"`token_load` decode policy only, with Redis configured. Shares the decode ledger across gateway replicas. `false` keeps it local to each replica.",
		func(g *Gateway) *bool { return &g.PD.TokenLoadSharedLedger }),
	enumVar("AIBRIX_DECODE_SCORE_POLICY", "decodeScorePolicy", docNames(decodePolicyDocs), false, AnyCase,
		"Default scoring policy for selecting decode pods.",
		func(g *Gateway) *string { return &g.PD.DecodeScorePolicy }),
	enumVar("AIBRIX_KV_CONNECTOR_TYPE", "kvConnectorType", []string{"shfs", "nixl"}, false, Exact,
		"vLLM KV transfer adapter: `shfs` for GPU (the `kv_transfer_params` round trip of vLLM's NixlConnector, as in `manifests/samples/pd-vllm`), `nixl` for Neuron (the prefill response passed whole as `disagg_prefill_resp`). The pod label `model.aibrix.ai/kv-connector-type` overrides it per pod.",
		func(g *Gateway) *string { return &g.PD.KVConnectorType }),
	floatVar("AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD", "prefillLoadImbalanceMinSpread", "prefillLoadImbalanceMinSpread", positive,
		"Request-count spread between prefill pods above which (strictly) the least-loaded prefill pod is chosen.",
		func(g *Gateway) *float64 { return &g.PD.PrefillLoadImbalanceMinSpread }),
	floatVar("AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD", "decodeLoadImbalanceMinSpread", "decodeLoadImbalanceMinSpread", positive,
		"`(max − min)` running-request spread between decode pods at or above which the least-loaded decode pod is chosen.",
		func(g *Gateway) *float64 { return &g.PD.DecodeLoadImbalanceMinSpread }),
	floatVar("AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD", "decodeThroughputImbalanceMinSpread", "decodeThroughputImbalanceMinSpread", positive,
		"`(max − min)` token-throughput spread (tok/s) between decode pods above which (strictly) the lowest-throughput pod is chosen.",
		func(g *Gateway) *float64 { return &g.PD.DecodeThroughputImbalanceMinSpread }),
	floatVar("AIBRIX_DECODE_SCORE_RATIO_THRESHOLD", "decodeScoreRatioThreshold", "decodeScoreRatioThreshold", positive,
		"`max_drain_score / min_drain_score` ratio above which the drain-rate fast path fires; each pod scores `effective_running_reqs / drain_rate`.",
		func(g *Gateway) *float64 { return &g.PD.DecodeScoreRatioThreshold }),
	floatVar("AIBRIX_DECODE_LB_WEIGHT_RUNNING", "decodeLBWeightRunning", "decodeLBWeightRunning", positive,
		"Weight of the normalized running-request term in the `load_balancing` decode score.",
		func(g *Gateway) *float64 { return &g.PD.DecodeLBWeightRunning }),
	floatVar("AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT", "decodeLBWeightThroughput", "decodeLBWeightThroughput", positive,
		"Weight of the normalized inverse-throughput term in the `load_balancing` decode score.",
		func(g *Gateway) *float64 { return &g.PD.DecodeLBWeightThroughput }),
	intVar("AIBRIX_TRT_MACHINE_ID", "trtMachineID", "", machineID,
		"10-bit machine ID in the Snowflake-style TensorRT-LLM `disagg_request_id`. Must differ between gateway processes sharing TRT workers.",
		func(g *Gateway) *int { return &g.PD.TRTMachineID }),
	enumVar("AIBRIX_TRT_SCHEDULE_STYLE", "trtScheduleStyle", []string{"context_first", "generation_first"}, true, AnyCase,
		"TensorRT-LLM dispatch mode. `generation_first` needs the Python KV-cache transceiver on both roles. An unrecognized value is logged and falls back to `context_first`.",
		func(g *Gateway) *string { return &g.PD.TRTScheduleStyle }),
	durationVar("AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT", "decodeFirstResponseTimeout", "decodeFirstResponseTimeout", time.Second, offOrPos,
		"SGLang decode watchdog: seconds a streaming request waits for the decode pod's first token after the prefill succeeded. `0` disables.",
		func(g *Gateway) *time.Duration { return &g.PD.DecodeFirstResponseTimeout }),
	durationVar("AIBRIX_DECODE_RESPONSE_TIMEOUT", "decodeResponseTimeout", "decodeResponseTimeout", time.Second, offOrPos,
		"SGLang decode watchdog: the same bound for a non-streaming request (the whole generation). `0` disables.",
		func(g *Gateway) *time.Duration { return &g.PD.DecodeResponseTimeout }),
	durationVar("AIBRIX_DECODE_STREAM_IDLE_TIMEOUT", "decodeStreamIdleTimeout", "decodeStreamIdleTimeout", time.Second, offOrPos,
		"SGLang decode watchdog, streaming only: longest gap between two chunks after the first token. `0` disables.",
		func(g *Gateway) *time.Duration { return &g.PD.DecodeStreamIdleTimeout }),
	engineListVar("TANDEM_DECODE_WATCHDOG_ENGINES", "decodeWatchdogEngines", "decodeWatchdogEngines",
		"Engines whose decode legs the decode watchdog guards (`epp` hand-off). The seed defines it for SGLang, whose prefill returns only once the decode pod took the KV; a vLLM or TensorRT-LLM decode pod may keep a request queued legitimately, so add them only to bound that wait.",
		func(g *Gateway) *EngineSet { return &g.PD.DecodeWatchdogEngines }),
	durationVar("AIBRIX_DECODE_ABORT_TIMEOUT", "decodeAbortTimeout", "decodeAbortTimeout", time.Second, offOrPos,
		"SGLang: per-attempt timeout of the `/abort_request` sent to the decode pod when a PD request fails. `0` sends no abort.",
		func(g *Gateway) *time.Duration { return &g.PD.DecodeAbortTimeout }),
	durationVar("AIBRIX_DECODE_ABORT_RETRY_DELAY", "decodeAbortRetryDelay", "decodeAbortRetryDelay", time.Second, nonNegative,
		"SGLang: delay before the second `/abort_request` attempt (skipped once the decode leg responds).",
		func(g *Gateway) *time.Duration { return &g.PD.DecodeAbortRetryDelay }),
	enumVar("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "prefixCacheTokenizerType", []string{"character", "tiktoken"}, false, Exact,
		"Tokenizer of the prefix index used by `prefix_cache`, `hybrid_cache_load` and `conductor`.",
		func(g *Gateway) *string { return &g.PD.PrefixCache.TokenizerType }),
	intVar("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "prefixCacheBlockSize", "", positive,
		"Tokens per block of the prefix index. (AIBrix uses 4; Tandem defaults to 128 to bound hashing cost on long prompts.)",
		func(g *Gateway) *int { return &g.PD.PrefixCache.BlockSize }),
	durationVar("AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS", "prefixCacheEvictionDurationMins", "", time.Minute, positive,
		"Minutes after which an unused prefix block is evicted from the index.",
		func(g *Gateway) *time.Duration { return &g.PD.PrefixCache.EvictionDuration }),
	intVar("AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "prefixCacheBlockNumber", "", positive,
		"Maximum number of blocks the prefix index holds (bounds its memory).",
		func(g *Gateway) *int { return &g.PD.PrefixCache.MaxBlocks }),
	floatVar("AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "prefixCacheStandardDeviationFactor", "", positive,
		"Prefill pods with a request count more than this many standard deviations above the mean are skipped in scoring.",
		func(g *Gateway) *float64 { return &g.PD.PrefixCache.StandardDeviationFactor }),
	durationVar("AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS", "podMetricRefreshIntervalMs", "", time.Millisecond, positive,
		"Milliseconds between two scrapes of an engine pod's metrics.",
		func(g *Gateway) *time.Duration { return &g.MetricRefreshInterval }),
	boolVar("TANDEM_OUTLIER_DETECTION", "outlierDetection",
		"Passive health (outlier detection, after Envoy's): every routed request's outcome and every scrape counts for or against its endpoint, and an endpoint that fails repeatedly is ejected (never a candidate) until its ejection time has passed *and* a scrape or probe of it has succeeded. `false` turns ejections, recent-failure demotion and their metrics off.",
		func(g *Gateway) *bool { return &g.Outlier.Enabled }),
	intVar("TANDEM_OUTLIER_CONSECUTIVE_5XX", "outlierConsecutive5xx", "", nonNegative,
		"Envoy's `consecutive_5xx`: consecutive 5xx answers (from the endpoint, or a prefill leg's 5xx in the epp hand-off) that eject an endpoint. A non-5xx answer resets the count. `0` disables this ejection.",
		func(g *Gateway) *int { return &g.Outlier.Consecutive5xx }),
	intVar("TANDEM_OUTLIER_CONSECUTIVE_GATEWAY_FAILURE", "outlierConsecutiveGatewayFailure", "", nonNegative,
		"Envoy's `consecutive_gateway_failure`, counted apart from 5xx: consecutive 502/503/504 answers and failures to reach the endpoint (the gateway's 502/503/504 local reply when it could not connect or timed out, a prefill leg's transport error or timeout, a scrape timeout) that eject it. `0` disables this ejection. A refused connection on the serving port ejects at once (an endpoint that never answered yet is only held out until it answers).",
		func(g *Gateway) *int { return &g.Outlier.ConsecutiveGatewayFailure }),
	durationVar("TANDEM_OUTLIER_INTERVAL_MS", "outlierIntervalMs", "", time.Millisecond, positive,
		"Envoy's `interval`: how often an ejected endpoint whose ejection time has passed is probed (`GET /health` on its serving port) when no scrape of it succeeded, and the period after which an endpoint that stayed in rotation has one repeated ejection forgiven.",
		func(g *Gateway) *time.Duration { return &g.Outlier.Interval }),
	durationVar("TANDEM_OUTLIER_BASE_EJECTION_TIME_MS", "outlierBaseEjectionTimeMs", "", time.Millisecond, positive,
		"Envoy's `base_ejection_time`: an ejection lasts this times the number of times the endpoint was ejected (less those forgiven), at most `TANDEM_OUTLIER_MAX_EJECTION_TIME_MS`; then the endpoint returns at its next successful scrape or probe, never on time alone.",
		func(g *Gateway) *time.Duration { return &g.Outlier.BaseEjectionTime }),
	durationVar("TANDEM_OUTLIER_MAX_EJECTION_TIME_MS", "outlierMaxEjectionTimeMs", "", time.Millisecond, positive,
		"Envoy's `max_ejection_time`: the longest one ejection lasts. As in Envoy, a value below `TANDEM_OUTLIER_BASE_EJECTION_TIME_MS` takes the base ejection time.",
		func(g *Gateway) *time.Duration { return &g.Outlier.MaxEjectionTime }),
	floatVar("TANDEM_OUTLIER_MAX_EJECTION_PERCENT", "outlierMaxEjectionPercent", "", pctRange,
		"Envoy's `max_ejection_percent`, per model and role group (prefill pods; the pods that serve requests: decode and standard): the most of a group that may be ejected at once, rounded down but always allowing one (endpoints held out because they never served, `not_serving_yet`, count neither in the group nor against it). Beyond it, and whenever an ejection would leave a model no complete roleset and no standard pod, the endpoint stays (counted in `tandem_outlier_ejections_overflow_total`): Tandem never ejects everything.",
		func(g *Gateway) *float64 { return &g.Outlier.MaxEjectionPercent }),
	durationVar("TANDEM_OUTLIER_RECENT_FAILURE_MS", "outlierRecentFailureMs", "", time.Millisecond, nonNegative,
		"Failing fast is not idleness: after k consecutive failures (no success since), an endpoint is demoted for k times this long, at most `TANDEM_OUTLIER_MAX_EJECTION_TIME_MS`: meanwhile it is a candidate only when the request cannot be served without it, whatever the policy (a pod that fails in a millisecond would otherwise look like the least loaded). `0` disables.",
		func(g *Gateway) *time.Duration { return &g.Outlier.RecentFailure }),
	boolVar("TANDEM_PD_PREFILL_RETRY", "pdPrefillRetry",
		"epp hand-off, engines whose prefill leg runs before the decode request is forwarded (vLLM, TensorRT-LLM `context_first`): when the prefill leg fails before anything reached the client (transport error, timeout, 5xx, the prefill pod ejected mid-flight), pick again without the failed pod (another pair, or a standard pod) and try once more, within the retry budget. `x-error-pd-prefill` is answered only when every attempt failed.",
		func(g *Gateway) *bool { return &g.Retry.PrefillRetry }),
	floatVar("TANDEM_PD_RETRY_BUDGET_PERCENT", "pdRetryBudgetPercent", "", pctRange,
		"Envoy's retry budget `budget_percent`: retries may be at most this share of the routed requests, both of those in flight and of those started in the last minute, so a cluster-wide outage does not double the load.",
		func(g *Gateway) *float64 { return &g.Retry.BudgetPercent }),
	intVar("TANDEM_PD_RETRY_MIN_CONCURRENCY", "pdRetryMinConcurrency", "", nonNegative,
		"Envoy's retry budget `min_retry_concurrency`: the budget never falls below this many retries (in flight, and in the last minute), so retries work at low traffic.",
		func(g *Gateway) *int { return &g.Retry.MinRetryConcurrency }),
	strategyVar("ROUTING_ALGORITHM", "routingAlgorithm",
		"Gateway default routing strategy, used when neither the model config nor the `routing-strategy` header names one. Unset: the `--config-file`'s scheduling when it has one, else `pd` when the model's endpoints carry prefill/decode roles, else `least-request`.",
		func(g *Gateway) *string { return &g.DefaultStrategy }),
	durationVar("TANDEM_SLO_TTFT_MS", "sloTTFTMs", "sloTTFTMs", time.Millisecond, offOrPos,
		"`pd-predictive` (`predicted_ttft`, `predicted_tpot`): time-to-first-token objective, in milliseconds, of requests that send no `x-slo-ttft-ms`. `0`: none (such requests are routed as if it were 1000 ms and never shed).",
		func(g *Gateway) *time.Duration { return &g.PD.SLOTTFT }),
	durationVar("TANDEM_SLO_TPOT_MS", "sloTPOTMs", "sloTPOTMs", time.Millisecond, offOrPos,
		"`pd-predictive` (`predicted_ttft`, `predicted_tpot`): time-per-output-token objective, in milliseconds, of requests that send no `x-slo-tpot-ms`. `0`: none (routed as if it were 50 ms).",
		func(g *Gateway) *time.Duration { return &g.PD.SLOTPOT }),
	durationVar("TANDEM_ADVISOR_WINDOW_SECONDS", "advisorWindowSeconds", "", time.Second, positive,
		"The P:D ratio advisor (`tandem_stage_saturation`, `tandem_recommended_pods`, `GET /advice` on the metrics port): how far back, in seconds, the traffic its saturation and recommended split rest on reaches. Shorter follows a change of traffic sooner and rests on fewer requests.",
		func(g *Gateway) *time.Duration { return &g.AdvisorWindow }),
	durationVar("TANDEM_PD_KV_HOLD_TIMEOUT_SECONDS", "pdKVHoldTimeoutSeconds", "", time.Second, positive,
		"`epp` hand-off: how long, in seconds, a prefill pod is counted as holding the KV of a finished prefill leg that no decode leg took and no abort released (`tandem_pd_stranded_kv_seconds_total{end=\"expired\"}`). Set it to the engines' own hold: vLLM's `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` (480 by default), TensorRT-LLM's `kv_transfer_timeout_ms`.",
		func(g *Gateway) *time.Duration { return &g.KVHoldTimeout }),
	topologyVar("TANDEM_TOPOLOGY_LABELS", "topologyLabels",
		"Topology-aware pairing: pod label keys that place a pod, nearest first (at most 4), e.g. node, NVLink domain, zone. The distance of a prefill/decode pair is the index of the first key both pods carry with the same value (else the number of keys). A soft preference, never a filter: where the score policy ties, the nearest pair wins, and `pd-predictive` adds the KV hand-over it learned per decode pod and distance (after 3 observations) to its prediction. A pod without `kubernetes.io/hostname` is given its node's name under it by the Kubernetes source. `none` switches it off.",
		func(g *Gateway) *TopologyLabels { return &g.PD.Topology }),
	enumVar("TANDEM_PD_HANDOFF", "pdHandoff", []string{HandoffAuto, HandoffSidecar, HandoffEPP}, false, Exact,
		"How the prefill target is handed over: `sidecar` (the `x-prefiller-host-port` header and metadata for a decode-side proxy), `epp` (Tandem runs the prefill leg itself, so plain engine pods disaggregate), or `auto`: per request, `sidecar` when the decode pod declares a routing sidecar (it carries llm-d's `llm-d.ai/role` label, as llm-d's decode pods with the routing sidecar do), else `epp`. The prefill target also travels as `envoy.lb` metadata in every mode.",
		func(g *Gateway) *string { return &g.PD.Handoff }),
	labelListVar("TANDEM_PAIR_MATCH_LABELS", "pairMatchLabels",
		"Pod label keys, comma-separated, whose values must be equal on a prefill and a decode pod for Tandem to pair them, so that a rolling update never pairs two revisions: a roleset becomes one roleset per revision, and a pod whose revision has no pod of the other role is left unpaired (warned at start-up and named in the decision trace). A label absent on both pods matches; present on one side only, it does not. The default is the revision label the DisaggregatedSet controller sets on both roles' pods; Deployments, StatefulSets and LeaderWorkerSets need a label of your own with one value in both roles' templates (docs/rollouts.md). `none` matches no label.",
		func(g *Gateway) *string { return &g.PairMatchLabels }),
	boolVar("TANDEM_PD_TRANSFER_HEADER", "pdTransferHeader",
		"Adds `x-tandem-pd-transfer: verified|recomputed|unknown`, the proof that the decode pod used the KV its prefill leg transferred (`docs/proof.md`), to PD responses whose proof is known before their headers go out: in the `epp` hand-off, answers that arrive whole in their first body chunk (non-streamed ones, usually). Streamed answers carry their evidence after the headers: it is counted (`tandem_pd_transfer_total`) but not in the header.",
		func(g *Gateway) *bool { return &g.PD.TransferHeader }),
	enumVar("TANDEM_PD_TRANSFER_PROOF", "pdTransferProof", []string{TransferProofLenient, TransferProofStrict}, false, Exact,
		"What a PD request whose KV transfer is not verified (`docs/proof.md`) costs it. `lenient`: it is served and counted (`tandem_pd_transfer_total`), and a decode pod whose transfers keep recomputing (2 of its last 3) receives no work while the pool can do without it, until a trial request after a back-off (30 s, doubling to 5 min) verifies again. `strict`: the same, and a recomputed or unverifiable transfer fails the request: before the response headers with a 502 and `x-error-pd-decode`, after them (a stream) by cutting the stream before its end. Profiles override it with `routingConfig.transferProof`.",
		func(g *Gateway) *string { return &g.PD.TransferProof }),
}

// VarByName finds a setting by its environment variable name.
func VarByName(name string) (*Var, bool) {
	for i := range Vars {
		if Vars[i].Name == name {
			return &Vars[i], true
		}
	}
	return nil, false
}

func varByKey(key string) (*Var, bool) {
	for i := range Vars {
		if Vars[i].Key == key {
			return &Vars[i], true
		}
	}
	return nil, false
}

func varByProfileKey(key string) (*Var, bool) {
	for i := range Vars {
		if Vars[i].ProfileKey != "" && Vars[i].ProfileKey == key {
			return &Vars[i], true
		}
	}
	return nil, false
}
