// Package config owns Tandem's one typed configuration: the seed's defaults, the AIBRIX_*
// environment variables, the --config-file YAML and the per-model profiles read from the
// model.aibrix.ai/config pod annotation. It validates and reports; it must not route.
package config

import (
	"slices"
	"strings"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

// PD holds every prefill/decode knob the seed names, with its gateway-wide value.
// A profile's routingConfig.pd overrides apply on top for that profile's requests.
type PD struct {
	PromptLengthBucketing bool   // AIBRIX_PROMPT_LENGTH_BUCKETING, false
	BucketServe           bool   // AIBRIX_BUCKET_SERVE, false
	BucketServeMode       string // AIBRIX_BUCKET_SERVE_MODE, "throughput" | "rps"

	PrefillRequestTimeout time.Duration // AIBRIX_PREFILL_REQUEST_TIMEOUT, 30s
	PrefillScorePolicy    string        // AIBRIX_PREFILL_SCORE_POLICY, "prefix_cache"
	DecodeScorePolicy     string        // AIBRIX_DECODE_SCORE_POLICY, "load_balancing"

	TokenLoadKVWeight           float64       // AIBRIX_TOKEN_LOAD_KV_WEIGHT, 0.3
	TokenLoadRequestCost        float64       // AIBRIX_TOKEN_LOAD_REQUEST_COST, 3500
	TokenLoadTTL                time.Duration // AIBRIX_TOKEN_LOAD_TTL_SECONDS, 3600s
	TokenLoadSessionTTL         time.Duration // AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS, 1800s (0 = off)
	TokenLoadMaxSessions        int           // AIBRIX_TOKEN_LOAD_MAX_SESSIONS, 100000
	HybridCacheLoadFactor       float64       // AIBRIX_HYBRID_CACHE_LOAD_FACTOR, 0.5
	MinMatchPct                 float64       // AIBRIX_MIN_MATCH_PCT, 0
	DecodeTokenLoadOutputGrowth bool          // AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH, true
	TokenLoadSharedLedger       bool          // AIBRIX_TOKEN_LOAD_SHARED_LEDGER, true

	KVConnectorType string // AIBRIX_KV_CONNECTOR_TYPE, "shfs" | "nixl"

	PrefillLoadImbalanceMinSpread      float64 // AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD, 16 (strict >)
	DecodeLoadImbalanceMinSpread       float64 // AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD, 16 (>=)
	DecodeThroughputImbalanceMinSpread float64 // AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD, 2048 (strict >)
	DecodeScoreRatioThreshold          float64 // AIBRIX_DECODE_SCORE_RATIO_THRESHOLD, 1.5
	DecodeLBWeightRunning              float64 // AIBRIX_DECODE_LB_WEIGHT_RUNNING, 1.0
	DecodeLBWeightThroughput           float64 // AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT, 1.0

	TRTMachineID     int    // AIBRIX_TRT_MACHINE_ID, 0, [0,1024)
	TRTScheduleStyle string // AIBRIX_TRT_SCHEDULE_STYLE, "context_first" | "generation_first"

	DecodeFirstResponseTimeout time.Duration // AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT, 60s (0 = off)
	DecodeResponseTimeout      time.Duration // AIBRIX_DECODE_RESPONSE_TIMEOUT, 0 (off)
	DecodeStreamIdleTimeout    time.Duration // AIBRIX_DECODE_STREAM_IDLE_TIMEOUT, 120s (0 = off)
	// DecodeWatchdogEngines are the engines whose decode legs the watchdog guards: SGLang's
	// prefill returns only once the decode pod took the KV, so from then on the decode pod owes
	// the answer; vLLM and TensorRT-LLM decode pods may queue legitimately (opt in per engine).
	DecodeWatchdogEngines EngineSet     // TANDEM_DECODE_WATCHDOG_ENGINES, sglang
	DecodeAbortTimeout    time.Duration // AIBRIX_DECODE_ABORT_TIMEOUT, 3s (0 = no abort)
	DecodeAbortRetryDelay time.Duration // AIBRIX_DECODE_ABORT_RETRY_DELAY, 2s

	PrefixCache PrefixCache

	// Handoff is how the prefill target is handed over: "sidecar" (headers and metadata for
	// a decode-side proxy), "epp" (Tandem runs the prefill leg itself) or "auto" (sidecar when
	// the decode pod declares a routing sidecar, else epp).
	Handoff string // TANDEM_PD_HANDOFF, "auto"

	// TransferHeader adds x-tandem-pd-transfer (the proof of the request's KV transfer) to PD
	// responses whose proof is known before their headers go out.
	TransferHeader bool // TANDEM_PD_TRANSFER_HEADER, false
	// TransferProof is what an unverified transfer costs the request: "lenient" (served,
	// counted; a decode pod that keeps recomputing is held out) or "strict" (it fails).
	TransferProof string // TANDEM_PD_TRANSFER_PROOF, "lenient"

	// SLOTTFT and SLOTPOT are the latency objectives of requests that do not send their own
	// (x-slo-ttft-ms, x-slo-tpot-ms), read by the predictive policies; 0 = none.
	SLOTTFT time.Duration // TANDEM_SLO_TTFT_MS, 0
	SLOTPOT time.Duration // TANDEM_SLO_TPOT_MS, 0

	// Topology is the pod labels that place a pod, nearest first: the pair step prefers a
	// prefill and a decode pod that share the earliest of them.
	Topology TopologyLabels // TANDEM_TOPOLOGY_LABELS, hostname, NVLink clique, zone
}

// The AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE values.
const (
	TokenizerCharacter = "character" // four bytes of prompt text make a token
	TokenizerTiktoken  = "tiktoken"  // cl100k_base token ids
)

// PrefixCache configures the prefix index used by prefix_cache, hybrid_cache_load and conductor.
type PrefixCache struct {
	TokenizerType           string        // AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE, "character"
	BlockSize               int           // AIBRIX_PREFIX_CACHE_BLOCK_SIZE, tokens per block
	EvictionDuration        time.Duration // AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS, 20m
	MaxBlocks               int           // AIBRIX_PREFIX_CACHE_BLOCK_NUMBER, 200000
	StandardDeviationFactor float64       // AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR, 1
}

// DefaultPD returns the seed's defaults.
func DefaultPD() PD {
	return PD{
		BucketServeMode:                    "throughput",
		PrefillRequestTimeout:              30 * time.Second,
		PrefillScorePolicy:                 "prefix_cache",
		DecodeScorePolicy:                  "load_balancing",
		TokenLoadKVWeight:                  0.3,
		TokenLoadRequestCost:               3500,
		TokenLoadTTL:                       3600 * time.Second,
		TokenLoadSessionTTL:                1800 * time.Second,
		TokenLoadMaxSessions:               100000,
		HybridCacheLoadFactor:              0.5,
		DecodeTokenLoadOutputGrowth:        true,
		TokenLoadSharedLedger:              true,
		KVConnectorType:                    "shfs",
		PrefillLoadImbalanceMinSpread:      16,
		DecodeLoadImbalanceMinSpread:       16,
		DecodeThroughputImbalanceMinSpread: 2048,
		DecodeScoreRatioThreshold:          1.5,
		DecodeLBWeightRunning:              1.0,
		DecodeLBWeightThroughput:           1.0,
		TRTScheduleStyle:                   "context_first",
		DecodeFirstResponseTimeout:         60 * time.Second,
		DecodeStreamIdleTimeout:            120 * time.Second,
		DecodeWatchdogEngines:              EngineSetOf(pool.EngineSGLang),
		DecodeAbortTimeout:                 3 * time.Second,
		DecodeAbortRetryDelay:              2 * time.Second,
		PrefixCache: PrefixCache{
			TokenizerType:           "character",
			BlockSize:               128,
			EvictionDuration:        20 * time.Minute,
			MaxBlocks:               200000,
			StandardDeviationFactor: 1,
		},
		Handoff:       HandoffAuto,
		TransferProof: TransferProofLenient,
		Topology:      DefaultTopologyLabels(),
	}
}

// RoutingConfig is a profile's routingConfig object from the model.aibrix.ai/config annotation,
// with the seed's JSON field names. Nil pointers mean "not set: keep the gateway value".
type RoutingConfig struct {
	PromptLenBucketMinLength int          `json:"promptLenBucketMinLength,omitempty"`
	PromptLenBucketMaxLength int          `json:"promptLenBucketMaxLength,omitempty"` // 0 = unlimited
	Combined                 bool         `json:"combined,omitempty"`
	PrefillScorePolicy       string       `json:"prefillScorePolicy,omitempty"`
	DecodeScorePolicy        string       `json:"decodeScorePolicy,omitempty"`
	PromptLengthBucketing    *bool        `json:"promptLengthBucketing,omitempty"`
	BucketServe              *bool        `json:"bucketServe,omitempty"`
	BucketServeMode          string       `json:"bucketServeMode,omitempty"`
	Handoff                  string       `json:"handoff,omitempty"`
	TransferProof            string       `json:"transferProof,omitempty"`
	PD                       *PDOverrides `json:"pd,omitempty"`
	// Sheddable marks the profile's requests as sheddable: a predictive strategy answers
	// 429 when no pod is predicted to meet their TTFT objective.
	Sheddable bool `json:"sheddable,omitempty"`
	// The config-profile: auto hints (AIBrix's names): a profile with any of them is a
	// candidate, matching when every hint it has holds.
	PromptTokensGte *int64 `json:"promptTokensGte,omitempty"`
	PromptTokensLt  *int64 `json:"promptTokensLt,omitempty"`
	MaxTokensGte    *int64 `json:"maxTokensGte,omitempty"`
	MaxTokensLt     *int64 `json:"maxTokensLt,omitempty"`
}

// PDOverrides are the per-profile overrides of gateway variables (routingConfig.pd).
// Durations are whole seconds, as in the seed.
type PDOverrides struct {
	PrefillRequestTimeout              *float64 `json:"prefillRequestTimeout,omitempty"`
	PrefillLoadImbalanceMinSpread      *float64 `json:"prefillLoadImbalanceMinSpread,omitempty"`
	DecodeLoadImbalanceMinSpread       *float64 `json:"decodeLoadImbalanceMinSpread,omitempty"`
	DecodeThroughputImbalanceMinSpread *float64 `json:"decodeThroughputImbalanceMinSpread,omitempty"`
	DecodeScoreRatioThreshold          *float64 `json:"decodeScoreRatioThreshold,omitempty"`
	DecodeLBWeightRunning              *float64 `json:"decodeLBWeightRunning,omitempty"`
	DecodeLBWeightThroughput           *float64 `json:"decodeLBWeightThroughput,omitempty"`
	TokenLoadKVWeight                  *float64 `json:"tokenLoadKVWeight,omitempty"`
	TokenLoadRequestCost               *float64 `json:"tokenLoadRequestCost,omitempty"`
	TokenLoadTTLSeconds                *float64 `json:"tokenLoadTTLSeconds,omitempty"`
	TokenLoadSessionTTLSeconds         *float64 `json:"tokenLoadSessionTTLSeconds,omitempty"`
	HybridCacheLoadFactor              *float64 `json:"hybridCacheLoadFactor,omitempty"`
	MinMatchPct                        *float64 `json:"minMatchPct,omitempty"`
	DecodeAbortTimeout                 *float64 `json:"decodeAbortTimeout,omitempty"`
	DecodeAbortRetryDelay              *float64 `json:"decodeAbortRetryDelay,omitempty"`
	DecodeFirstResponseTimeout         *float64 `json:"decodeFirstResponseTimeout,omitempty"`
	DecodeResponseTimeout              *float64 `json:"decodeResponseTimeout,omitempty"`
	DecodeStreamIdleTimeout            *float64 `json:"decodeStreamIdleTimeout,omitempty"`
	SLOTTFTMs                          *float64 `json:"sloTTFTMs,omitempty"`
	SLOTPOTMs                          *float64 `json:"sloTPOTMs,omitempty"`
	// DecodeWatchdogEngines is a comma-separated engine list (a JSON string or array of strings).
	DecodeWatchdogEngines *string `json:"decodeWatchdogEngines,omitempty"`
}

// Profile is one named profile of a model config.
type Profile struct {
	RoutingStrategy string         `json:"routingStrategy,omitempty"`
	RoutingConfig   *RoutingConfig `json:"routingConfig,omitempty"`
}

// ModelConfig is the model.aibrix.ai/config annotation.
type ModelConfig struct {
	LockedRoutingStrategy string             `json:"lockedRoutingStrategy,omitempty"`
	DefaultProfile        string             `json:"defaultProfile,omitempty"`
	Profiles              map[string]Profile `json:"profiles,omitempty"`
}

// Gateway is the gateway-wide configuration: the PD knobs plus the settings that are not
// per-profile. Build it with FromEnv or Load; DefaultGateway holds the defaults.
type Gateway struct {
	PD PD
	// DefaultStrategy is the routing strategy used when neither the model config nor the
	// request names one (ROUTING_ALGORITHM). Empty lets the picker choose: pd when the
	// candidates carry prefill/decode roles, least-request otherwise.
	DefaultStrategy string
	// MetricRefreshInterval is how often engine metrics are scraped
	// (AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS).
	MetricRefreshInterval time.Duration
	// Outlier is passive health (outlier detection, internal/health).
	Outlier Outlier
	// Retry is the epp hand-off's pair-level retry and its budget.
	Retry Retry
	// AdvisorWindow is how far back the traffic the P:D ratio advisor rests on reaches
	// (TANDEM_ADVISOR_WINDOW_SECONDS).
	AdvisorWindow time.Duration
	// PairMatchLabels are the pod label keys, comma-separated, whose values must match
	// between a prefill and a decode pod of one pair (TANDEM_PAIR_MATCH_LABELS; "": none).
	// The pool sources read each pod's Revision with PairMatch.
	PairMatchLabels string
	// KVHoldTimeout bounds how long a prefill pod is counted as holding a finished prefill
	// leg's KV that no decode leg took (TANDEM_PD_KV_HOLD_TIMEOUT_SECONDS, 480s: the engines'
	// default hold).
	KVHoldTimeout time.Duration
}

// PairMatch is PairMatchLabels as the pool sources use it.
func (g *Gateway) PairMatch() pool.PairMatch {
	if g.PairMatchLabels == "" {
		return nil
	}
	return strings.Split(g.PairMatchLabels, ",")
}

// Outlier configures passive health, modelled on Envoy's outlier detection (the names in
// comments are Envoy's). Durations are wall time.
type Outlier struct {
	Enabled                   bool          // TANDEM_OUTLIER_DETECTION, true
	Consecutive5xx            int           // TANDEM_OUTLIER_CONSECUTIVE_5XX, 5 (consecutive_5xx; 0 = off)
	ConsecutiveGatewayFailure int           // TANDEM_OUTLIER_CONSECUTIVE_GATEWAY_FAILURE, 5 (consecutive_gateway_failure; 0 = off)
	Interval                  time.Duration // TANDEM_OUTLIER_INTERVAL_MS, 10s (interval)
	BaseEjectionTime          time.Duration // TANDEM_OUTLIER_BASE_EJECTION_TIME_MS, 30s (base_ejection_time)
	MaxEjectionTime           time.Duration // TANDEM_OUTLIER_MAX_EJECTION_TIME_MS, 300s (max_ejection_time)
	MaxEjectionPercent        float64       // TANDEM_OUTLIER_MAX_EJECTION_PERCENT, 50 (max_ejection_percent)
	RecentFailure             time.Duration // TANDEM_OUTLIER_RECENT_FAILURE_MS, 2s (0 = off; Tandem's own)
}

// Retry configures the epp hand-off's pair-level retry: one more attempt on another pair when
// the prefill leg fails before anything reached the client, within a budget modelled on
// Envoy's retry_budget.
type Retry struct {
	PrefillRetry        bool    // TANDEM_PD_PREFILL_RETRY, true
	BudgetPercent       float64 // TANDEM_PD_RETRY_BUDGET_PERCENT, 20 (budget_percent)
	MinRetryConcurrency int     // TANDEM_PD_RETRY_MIN_CONCURRENCY, 3 (min_retry_concurrency)
}

// DefaultOutlier returns passive health's defaults.
func DefaultOutlier() Outlier {
	return Outlier{Enabled: true, Consecutive5xx: 5, ConsecutiveGatewayFailure: 5, Interval: 10 * time.Second,
		BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second, MaxEjectionPercent: 50,
		RecentFailure: 2 * time.Second}
}

// DefaultRetry returns the pair-level retry's defaults.
func DefaultRetry() Retry {
	return Retry{PrefillRetry: true, BudgetPercent: 20, MinRetryConcurrency: 3}
}

// DefaultGateway returns the seed's defaults for every gateway setting.
func DefaultGateway() Gateway {
	return Gateway{
		PD:                    DefaultPD(),
		MetricRefreshInterval: time.Second, // cost grows with endpoints ÷ interval: 1 s keeps 1024 pods under 0.2 cores
		Outlier:               DefaultOutlier(),
		Retry:                 DefaultRetry(),
		AdvisorWindow:         time.Minute,
		PairMatchLabels:       strings.Join(pool.DefaultPairMatch, ","),
		KVHoldTimeout:         480 * time.Second,
	}
}

// WatchdogGuards reports whether the decode watchdog is armed for a decode leg on engine.
func (pd *PD) WatchdogGuards(engine string) bool { return pd.DecodeWatchdogEngines.Has(engine) }

// Engines is every engine an EngineSet can hold, in the order it lists them.
var Engines = []string{pool.EngineSGLang, pool.EngineVLLM, pool.EngineTRTLLM}

// EngineSet is a set of Engines (a bit each), comparable so Gateway stays comparable.
type EngineSet uint8

// EngineSetOf returns the set of the named engines; unknown names are left out.
func EngineSetOf(engines ...string) EngineSet {
	var s EngineSet
	for _, e := range engines {
		if i := slices.Index(Engines, e); i >= 0 {
			s |= 1 << i
		}
	}
	return s
}

// Has reports whether engine is in the set.
func (s EngineSet) Has(engine string) bool {
	i := slices.Index(Engines, engine)
	return i >= 0 && s&(1<<i) != 0
}

// String lists the set's engines comma-separated, in Engines order.
func (s EngineSet) String() string {
	var out []string
	for i, e := range Engines {
		if s&(1<<i) != 0 {
			out = append(out, e)
		}
	}
	return strings.Join(out, ",")
}

// Covers reports whether a pod with this routing config serves a prompt of n tokens, with the
// seed's rules: the minimum defaults to 0 and a negative one counts as 0; a maximum of 0 means
// unlimited; min > max is never suitable; otherwise min ≤ n ≤ max. The zero RoutingConfig (a pod
// without the annotation) covers every length.
func (rc RoutingConfig) Covers(n int) bool {
	lo := max(rc.PromptLenBucketMinLength, 0)
	hi := rc.PromptLenBucketMaxLength
	if hi <= 0 {
		return n >= lo
	}
	return lo <= hi && lo <= n && n <= hi
}

// MaxTopologyLabels is the most label keys TANDEM_TOPOLOGY_LABELS takes.
const MaxTopologyLabels = 4

// Well-known labels that place a pod: its node (Kubernetes sets it on nodes; Tandem reads a
// pod's spec.nodeName under it), its NVLink domain (NVIDIA's GPU feature discovery labels
// nodes with it) and its zone.
const (
	LabelHostname  = "kubernetes.io/hostname"
	LabelGPUClique = "nvidia.com/gpu.clique"
	LabelZone      = "topology.kubernetes.io/zone"
)

// TopologyLabels is an ordered list of at most MaxTopologyLabels label keys, nearest
// first; comparable, so Gateway stays comparable. The zero value is empty (off).
type TopologyLabels struct {
	keys [MaxTopologyLabels]string
	n    uint8
}

// DefaultTopologyLabels is node, then NVLink domain, then zone.
func DefaultTopologyLabels() TopologyLabels {
	t, _ := NewTopologyLabels(LabelHostname, LabelGPUClique, LabelZone)
	return t
}

// NewTopologyLabels returns the keys as TopologyLabels; false when there are too many, one
// is empty or repeated.
func NewTopologyLabels(keys ...string) (TopologyLabels, bool) {
	var t TopologyLabels
	if len(keys) > MaxTopologyLabels {
		return t, false
	}
	for _, k := range keys {
		if k == "" || slices.Contains(t.keys[:t.n], k) {
			return TopologyLabels{}, false
		}
		t.keys[t.n] = k
		t.n++
	}
	return t, true
}

// Len is the number of keys (0: topology-aware pairing is off).
func (t TopologyLabels) Len() int { return int(t.n) }

// Key is the i-th key, nearest first.
func (t TopologyLabels) Key(i int) string { return t.keys[i] }

// Distance is the distance class of two pods with these labels: the index of the first key
// both carry with the same value, else Len() (nothing in common, or unknown).
func (t TopologyLabels) Distance(a, b map[string]string) int {
	return t.Between(t.Place(a), t.Place(b))
}

// Placement is a pod's values of the topology labels, in their order ("" where it has none).
type Placement [MaxTopologyLabels]string

// Place is the placement of a pod with these labels.
func (t TopologyLabels) Place(labels map[string]string) Placement {
	var p Placement
	for i := 0; i < int(t.n); i++ {
		p[i] = labels[t.keys[i]]
	}
	return p
}

// Between is the distance class of two placements (see Distance).
func (t TopologyLabels) Between(a, b Placement) int {
	for i := 0; i < int(t.n); i++ {
		if a[i] != "" && a[i] == b[i] {
			return i
		}
	}
	return int(t.n)
}

// String lists the keys comma-separated, or "none".
func (t TopologyLabels) String() string {
	if t.n == 0 {
		return NoLabels
	}
	return strings.Join(t.keys[:t.n], ",")
}
