package config

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// The rules a policy name breaks: one of the documented policies (TestSeedPoliciesDocumented
// pins that the seed's are among them).
var (
	prefillPolicyRule = oneOf(docNames(prefillPolicyDocs))
	decodePolicyRule  = oneOf(docNames(decodePolicyDocs))
)

// The seed's score policies, and Tandem's predictive ones, are accepted (a policy may be added,
// none of these dropped).
func TestSeedPoliciesDocumented(t *testing.T) {
	for _, tc := range []struct {
		docs []nameDoc
		want []string
	}{
		{prefillPolicyDocs, []string{"prefix_cache", "least_request", "conductor", "token_load", "hybrid_cache_load", "predicted_ttft"}},
		{decodePolicyDocs, []string{"load_balancing", "least_request", "conductor", "token_load", "predicted_tpot"}},
	} {
		for _, w := range tc.want {
			if !slices.Contains(docNames(tc.docs), w) {
				t.Errorf("%q is missing from the documented policies %v", w, docNames(tc.docs))
			}
		}
	}
}

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// The seed's defaults, typed by hand from its tables (and research §7.5 for the prefix cache).
var seedDefaults = map[string]string{
	"AIBRIX_PROMPT_LENGTH_BUCKETING":                "false",
	"AIBRIX_BUCKET_SERVE":                           "false",
	"AIBRIX_BUCKET_SERVE_MODE":                      "throughput",
	"AIBRIX_PREFILL_REQUEST_TIMEOUT":                "30",
	"AIBRIX_PREFILL_SCORE_POLICY":                   "prefix_cache",
	"AIBRIX_TOKEN_LOAD_KV_WEIGHT":                   "0.3",
	"AIBRIX_TOKEN_LOAD_REQUEST_COST":                "3500",
	"AIBRIX_TOKEN_LOAD_TTL_SECONDS":                 "3600",
	"AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS":         "1800",
	"AIBRIX_TOKEN_LOAD_MAX_SESSIONS":                "100000",
	"AIBRIX_HYBRID_CACHE_LOAD_FACTOR":               "0.5",
	"AIBRIX_MIN_MATCH_PCT":                          "0",
	"AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH":        "true",
	"AIBRIX_TOKEN_LOAD_SHARED_LEDGER":               "true",
	"AIBRIX_DECODE_SCORE_POLICY":                    "load_balancing",
	"AIBRIX_KV_CONNECTOR_TYPE":                      "shfs",
	"AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD":      "16",
	"AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD":       "16",
	"AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD": "2048",
	"AIBRIX_DECODE_SCORE_RATIO_THRESHOLD":           "1.5",
	"AIBRIX_DECODE_LB_WEIGHT_RUNNING":               "1",
	"AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT":            "1",
	"AIBRIX_TRT_MACHINE_ID":                         "0",
	"AIBRIX_TRT_SCHEDULE_STYLE":                     "context_first",
	"AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT":          "60",
	"AIBRIX_DECODE_RESPONSE_TIMEOUT":                "0",
	"AIBRIX_DECODE_STREAM_IDLE_TIMEOUT":             "120",
	"AIBRIX_DECODE_ABORT_TIMEOUT":                   "3",
	"AIBRIX_DECODE_ABORT_RETRY_DELAY":               "2",
	"AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE":            "character",
	"AIBRIX_PREFIX_CACHE_BLOCK_SIZE":                "128", // Tandem's choice; AIBrix uses 4 (documented)
	"AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS":    "20",
	"AIBRIX_PREFIX_CACHE_BLOCK_NUMBER":              "200000",
	"AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR": "1",
	// Not in the seed's tables; AIBrix scrapes every 50 ms. Tandem defaults to 1 s because scraping cost grows
	// with endpoints ÷ interval (docs/metrics.md: 0.15 cores for 1024 pods at 1 s, ~3 cores at 50 ms).
	"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "1000",
	"ROUTING_ALGORITHM":                     "",     // the picker chooses: pd for PD pools, else least-request
	"TANDEM_PD_HANDOFF":                     "auto", // Tandem's own; not in the seed (was sidecar before issue 13)
	// Tandem's: the seed defines the decode watchdog for SGLang only.
	"TANDEM_DECODE_WATCHDOG_ENGINES": "sglang",
	"TANDEM_TOPOLOGY_LABELS":         "kubernetes.io/hostname,nvidia.com/gpu.clique,topology.kubernetes.io/zone",
	// Issue 18's predictive policies: no objective unless the operator or the request sets one.
	"TANDEM_SLO_TTFT_MS": "0",
	"TANDEM_SLO_TPOT_MS": "0",
	// Rollout-safe pairs: the one label a controller sets alike on both roles' pods of a revision.
	"TANDEM_PAIR_MATCH_LABELS": "disaggregatedset.x-k8s.io/revision",
	// The P:D ratio advisor's traffic window (issue 27).
	"TANDEM_ADVISOR_WINDOW_SECONDS":     "60",
	"TANDEM_PD_KV_HOLD_TIMEOUT_SECONDS": "480",
	// Passive health and the pair-level retry (issue 12): Envoy's outlier-detection and
	// retry-budget defaults, except max_ejection_percent (Envoy: 10; PD pools have a handful of
	// pods per role) and Tandem's own recent-failure window.
	"TANDEM_OUTLIER_DETECTION":                   "true",
	"TANDEM_OUTLIER_CONSECUTIVE_5XX":             "5",
	"TANDEM_OUTLIER_CONSECUTIVE_GATEWAY_FAILURE": "5",
	"TANDEM_OUTLIER_INTERVAL_MS":                 "10000",
	"TANDEM_OUTLIER_BASE_EJECTION_TIME_MS":       "30000",
	"TANDEM_OUTLIER_MAX_EJECTION_TIME_MS":        "300000",
	"TANDEM_OUTLIER_MAX_EJECTION_PERCENT":        "50",
	"TANDEM_OUTLIER_RECENT_FAILURE_MS":           "2000",
	"TANDEM_PD_PREFILL_RETRY":                    "true",
	"TANDEM_PD_RETRY_BUDGET_PERCENT":             "20",
	"TANDEM_PD_RETRY_MIN_CONCURRENCY":            "3",
	"TANDEM_PD_TRANSFER_HEADER":                  "false",
	"TANDEM_PD_TRANSFER_PROOF":                   "lenient",
}

func TestDefaultsMatchTheSeed(t *testing.T) {
	if len(seedDefaults) != len(Vars) {
		t.Errorf("%d variables defined, %d in the seed table: add the new one here with its documented default", len(Vars), len(seedDefaults))
	}
	for _, v := range Vars {
		want, ok := seedDefaults[v.Name]
		if !ok {
			t.Errorf("%s: no seed default in this test", v.Name)
			continue
		}
		if got := v.Default(); got != want {
			t.Errorf("%s default = %q, seed says %q", v.Name, got, want)
		}
	}
	g, warns, err := FromEnv(envOf(nil))
	if err != nil || len(warns) != 0 {
		t.Fatalf("empty environment: %v %v", warns, err)
	}
	if !reflect.DeepEqual(g, DefaultGateway()) {
		t.Errorf("empty environment gives %+v, want the defaults", g)
	}
}

// Each row sets one variable to a valid value and checks the typed field.
func TestEnvValidValues(t *testing.T) {
	cases := []struct {
		name, value string
		check       func(g Gateway) any
		want        any
	}{
		{"AIBRIX_PROMPT_LENGTH_BUCKETING", "true", func(g Gateway) any { return g.PD.PromptLengthBucketing }, true},
		{"AIBRIX_PROMPT_LENGTH_BUCKETING", "0", func(g Gateway) any { return g.PD.PromptLengthBucketing }, false},
		{"AIBRIX_BUCKET_SERVE_MODE", "rps", func(g Gateway) any { return g.PD.BucketServeMode }, "rps"},
		{"AIBRIX_PREFILL_REQUEST_TIMEOUT", "5", func(g Gateway) any { return g.PD.PrefillRequestTimeout }, 5 * time.Second},
		{"AIBRIX_PREFILL_SCORE_POLICY", "hybrid_cache_load", func(g Gateway) any { return g.PD.PrefillScorePolicy }, "hybrid_cache_load"},
		{"AIBRIX_TOKEN_LOAD_KV_WEIGHT", "0.01", func(g Gateway) any { return g.PD.TokenLoadKVWeight }, 0.01},
		{"AIBRIX_TOKEN_LOAD_REQUEST_COST", "1", func(g Gateway) any { return g.PD.TokenLoadRequestCost }, 1.0},
		{"AIBRIX_TOKEN_LOAD_TTL_SECONDS", "60", func(g Gateway) any { return g.PD.TokenLoadTTL }, time.Minute},
		{"AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS", "0", func(g Gateway) any { return g.PD.TokenLoadSessionTTL }, time.Duration(0)},
		{"AIBRIX_TOKEN_LOAD_MAX_SESSIONS", "7", func(g Gateway) any { return g.PD.TokenLoadMaxSessions }, 7},
		{"AIBRIX_HYBRID_CACHE_LOAD_FACTOR", "1", func(g Gateway) any { return g.PD.HybridCacheLoadFactor }, 1.0},
		{"AIBRIX_HYBRID_CACHE_LOAD_FACTOR", "0", func(g Gateway) any { return g.PD.HybridCacheLoadFactor }, 0.0},
		{"AIBRIX_MIN_MATCH_PCT", "100", func(g Gateway) any { return g.PD.MinMatchPct }, 100.0},
		{"AIBRIX_MIN_MATCH_PCT", "45.5", func(g Gateway) any { return g.PD.MinMatchPct }, 45.5},
		{"AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH", "false", func(g Gateway) any { return g.PD.DecodeTokenLoadOutputGrowth }, false},
		{"AIBRIX_TOKEN_LOAD_SHARED_LEDGER", "false", func(g Gateway) any { return g.PD.TokenLoadSharedLedger }, false},
		{"AIBRIX_DECODE_SCORE_POLICY", "conductor", func(g Gateway) any { return g.PD.DecodeScorePolicy }, "conductor"},
		{"AIBRIX_KV_CONNECTOR_TYPE", "nixl", func(g Gateway) any { return g.PD.KVConnectorType }, "nixl"},
		{"AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD", "0.5", func(g Gateway) any { return g.PD.PrefillLoadImbalanceMinSpread }, 0.5},
		{"AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD", "4", func(g Gateway) any { return g.PD.DecodeLoadImbalanceMinSpread }, 4.0},
		{"AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD", "100.5", func(g Gateway) any { return g.PD.DecodeThroughputImbalanceMinSpread }, 100.5},
		{"AIBRIX_DECODE_SCORE_RATIO_THRESHOLD", "2", func(g Gateway) any { return g.PD.DecodeScoreRatioThreshold }, 2.0},
		{"AIBRIX_DECODE_LB_WEIGHT_RUNNING", "0.25", func(g Gateway) any { return g.PD.DecodeLBWeightRunning }, 0.25},
		{"AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT", "2.5", func(g Gateway) any { return g.PD.DecodeLBWeightThroughput }, 2.5},
		{"AIBRIX_TRT_MACHINE_ID", "1023", func(g Gateway) any { return g.PD.TRTMachineID }, 1023},
		{"AIBRIX_TRT_SCHEDULE_STYLE", "generation_first", func(g Gateway) any { return g.PD.TRTScheduleStyle }, "generation_first"},
		{"AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT", "0", func(g Gateway) any { return g.PD.DecodeFirstResponseTimeout }, time.Duration(0)},
		{"AIBRIX_DECODE_RESPONSE_TIMEOUT", "600", func(g Gateway) any { return g.PD.DecodeResponseTimeout }, 10 * time.Minute},
		{"AIBRIX_DECODE_STREAM_IDLE_TIMEOUT", "30", func(g Gateway) any { return g.PD.DecodeStreamIdleTimeout }, 30 * time.Second},
		{"AIBRIX_DECODE_ABORT_TIMEOUT", "0", func(g Gateway) any { return g.PD.DecodeAbortTimeout }, time.Duration(0)},
		{"AIBRIX_DECODE_ABORT_RETRY_DELAY", "0", func(g Gateway) any { return g.PD.DecodeAbortRetryDelay }, time.Duration(0)},
		{"AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "tiktoken", func(g Gateway) any { return g.PD.PrefixCache.TokenizerType }, "tiktoken"},
		{"AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "4", func(g Gateway) any { return g.PD.PrefixCache.BlockSize }, 4},
		{"AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS", "5", func(g Gateway) any { return g.PD.PrefixCache.EvictionDuration }, 5 * time.Minute},
		{"AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "1000", func(g Gateway) any { return g.PD.PrefixCache.MaxBlocks }, 1000},
		{"AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "2", func(g Gateway) any { return g.PD.PrefixCache.StandardDeviationFactor }, 2.0},
		{"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS", "250", func(g Gateway) any { return g.MetricRefreshInterval }, 250 * time.Millisecond},
		{"ROUTING_ALGORITHM", " PD ", func(g Gateway) any { return g.DefaultStrategy }, "pd"},
		{"TANDEM_PD_HANDOFF", "epp", func(g Gateway) any { return g.PD.Handoff }, "epp"},
		{"TANDEM_DECODE_WATCHDOG_ENGINES", " vllm, sglang", func(g Gateway) any { return g.PD.DecodeWatchdogEngines.String() }, "sglang,vllm"},
		{"TANDEM_TOPOLOGY_LABELS", " rack , topology.kubernetes.io/zone", func(g Gateway) any { return g.PD.Topology.String() }, "rack,topology.kubernetes.io/zone"},
		{"TANDEM_TOPOLOGY_LABELS", "none", func(g Gateway) any { return g.PD.Topology.Len() }, 0},
		{"TANDEM_SLO_TTFT_MS", "800", func(g Gateway) any { return g.PD.SLOTTFT }, 800 * time.Millisecond},
		{"TANDEM_SLO_TPOT_MS", "0", func(g Gateway) any { return g.PD.SLOTPOT }, time.Duration(0)},
		{"TANDEM_ADVISOR_WINDOW_SECONDS", "120", func(g Gateway) any { return g.AdvisorWindow }, 2 * time.Minute},
		{"TANDEM_PAIR_MATCH_LABELS", " app.kubernetes.io/version , example.com/rev", func(g Gateway) any { return g.PairMatchLabels }, "app.kubernetes.io/version,example.com/rev"},
		{"TANDEM_PD_KV_HOLD_TIMEOUT_SECONDS", "60", func(g Gateway) any { return g.KVHoldTimeout }, time.Minute},
		{"TANDEM_OUTLIER_DETECTION", "false", func(g Gateway) any { return g.Outlier.Enabled }, false},
		{"TANDEM_OUTLIER_CONSECUTIVE_5XX", "0", func(g Gateway) any { return g.Outlier.Consecutive5xx }, 0},
		{"TANDEM_OUTLIER_CONSECUTIVE_GATEWAY_FAILURE", "2", func(g Gateway) any { return g.Outlier.ConsecutiveGatewayFailure }, 2},
		{"TANDEM_OUTLIER_INTERVAL_MS", "500", func(g Gateway) any { return g.Outlier.Interval }, 500 * time.Millisecond},
		{"TANDEM_OUTLIER_BASE_EJECTION_TIME_MS", "1500", func(g Gateway) any { return g.Outlier.BaseEjectionTime }, 1500 * time.Millisecond},
		{"TANDEM_OUTLIER_MAX_EJECTION_TIME_MS", "60000", func(g Gateway) any { return g.Outlier.MaxEjectionTime }, time.Minute},
		{"TANDEM_OUTLIER_MAX_EJECTION_PERCENT", "100", func(g Gateway) any { return g.Outlier.MaxEjectionPercent }, 100.0},
		{"TANDEM_OUTLIER_RECENT_FAILURE_MS", "0", func(g Gateway) any { return g.Outlier.RecentFailure }, time.Duration(0)},
		{"TANDEM_PD_PREFILL_RETRY", "false", func(g Gateway) any { return g.Retry.PrefillRetry }, false},
		{"TANDEM_PD_TRANSFER_HEADER", "true", func(g Gateway) any { return g.PD.TransferHeader }, true},
		{"TANDEM_PD_TRANSFER_PROOF", "strict", func(g Gateway) any { return g.PD.TransferProof }, "strict"},
		{"TANDEM_PD_RETRY_BUDGET_PERCENT", "0", func(g Gateway) any { return g.Retry.BudgetPercent }, 0.0},
		{"TANDEM_PD_RETRY_MIN_CONCURRENCY", "10", func(g Gateway) any { return g.Retry.MinRetryConcurrency }, 10},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.name] = true
		env := map[string]string{c.name: c.value}
		g, warns, err := FromEnv(envOf(env))
		if err != nil || len(warns) > 0 {
			t.Errorf("%s=%s: unexpected %v %v", c.name, c.value, warns, err)
			continue
		}
		if got := c.check(g); got != c.want {
			t.Errorf("%s=%s: got %v, want %v", c.name, c.value, got, c.want)
		}
	}
	for _, v := range Vars {
		if !covered[v.Name] && v.Name != "AIBRIX_BUCKET_SERVE" { // needs bucketing: see TestBucketServeNeedsBucketing
			t.Errorf("%s has no valid-value case", v.Name)
		}
	}
}

// Each row is one invalid value and the exact message the operator sees.
func TestEnvInvalidValues(t *testing.T) {
	cases := []struct{ name, value, want string }{
		{"AIBRIX_PROMPT_LENGTH_BUCKETING", "yes", "AIBRIX_PROMPT_LENGTH_BUCKETING=yes: must be true or false"},
		{"TANDEM_DECODE_WATCHDOG_ENGINES", "sglang,llamacpp", "TANDEM_DECODE_WATCHDOG_ENGINES=sglang,llamacpp: must be a comma-separated list of sglang, vllm, trtllm"},
		{"TANDEM_DECODE_WATCHDOG_ENGINES", "vllm,vllm", "TANDEM_DECODE_WATCHDOG_ENGINES=vllm,vllm: must be a comma-separated list of sglang, vllm, trtllm"},
		{"TANDEM_TOPOLOGY_LABELS", "a,b,c,d,e", "TANDEM_TOPOLOGY_LABELS=a,b,c,d,e: must be none or 1 to 4 distinct comma-separated label keys, nearest first, e.g. kubernetes.io/hostname,topology.kubernetes.io/zone (5 keys, at most 4)"},
		{"TANDEM_TOPOLOGY_LABELS", "zone,bad key", "TANDEM_TOPOLOGY_LABELS=zone,bad key: must be none or 1 to 4 distinct comma-separated label keys, nearest first, e.g. kubernetes.io/hostname,topology.kubernetes.io/zone (\"bad key\" is not a label key: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]'))"},
		{"TANDEM_TOPOLOGY_LABELS", "zone,,rack", "TANDEM_TOPOLOGY_LABELS=zone,,rack: must be none or 1 to 4 distinct comma-separated label keys, nearest first, e.g. kubernetes.io/hostname,topology.kubernetes.io/zone (an empty key: two commas in a row, or one at an end)"},
		{"AIBRIX_BUCKET_SERVE", "on", "AIBRIX_BUCKET_SERVE=on: must be true or false"},
		{"AIBRIX_PREFILL_REQUEST_TIMEOUT", "0", "AIBRIX_PREFILL_REQUEST_TIMEOUT=0: must be positive"},
		{"AIBRIX_PREFILL_REQUEST_TIMEOUT", "1.5", "AIBRIX_PREFILL_REQUEST_TIMEOUT=1.5: must be a whole number"},
		{"AIBRIX_PREFILL_REQUEST_TIMEOUT", "30s", "AIBRIX_PREFILL_REQUEST_TIMEOUT=30s: must be a whole number"},
		{"AIBRIX_PREFILL_SCORE_POLICY", "random", "AIBRIX_PREFILL_SCORE_POLICY=random: " + prefillPolicyRule},
		{"AIBRIX_TOKEN_LOAD_KV_WEIGHT", "-1", "AIBRIX_TOKEN_LOAD_KV_WEIGHT=-1: must be positive"},
		{"AIBRIX_TOKEN_LOAD_KV_WEIGHT", "0", "AIBRIX_TOKEN_LOAD_KV_WEIGHT=0: must be positive"},
		{"AIBRIX_TOKEN_LOAD_KV_WEIGHT", "NaN", "AIBRIX_TOKEN_LOAD_KV_WEIGHT=NaN: must be a number"},
		{"AIBRIX_TOKEN_LOAD_REQUEST_COST", "-5", "AIBRIX_TOKEN_LOAD_REQUEST_COST=-5: must be positive"},
		{"AIBRIX_TOKEN_LOAD_TTL_SECONDS", "0", "AIBRIX_TOKEN_LOAD_TTL_SECONDS=0: must be positive"},
		{"AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS", "-1", "AIBRIX_TOKEN_LOAD_SESSION_TTL_SECONDS=-1: must be 0 (disabled) or positive"},
		{"AIBRIX_TOKEN_LOAD_MAX_SESSIONS", "0", "AIBRIX_TOKEN_LOAD_MAX_SESSIONS=0: must be positive"},
		{"AIBRIX_TOKEN_LOAD_MAX_SESSIONS", "1e5", "AIBRIX_TOKEN_LOAD_MAX_SESSIONS=1e5: must be a whole number"},
		{"AIBRIX_HYBRID_CACHE_LOAD_FACTOR", "1.01", "AIBRIX_HYBRID_CACHE_LOAD_FACTOR=1.01: must be 0 to 1"},
		{"AIBRIX_HYBRID_CACHE_LOAD_FACTOR", "-0.1", "AIBRIX_HYBRID_CACHE_LOAD_FACTOR=-0.1: must be 0 to 1"},
		{"AIBRIX_MIN_MATCH_PCT", "101", "AIBRIX_MIN_MATCH_PCT=101: must be 0 to 100"},
		{"AIBRIX_MIN_MATCH_PCT", "-1", "AIBRIX_MIN_MATCH_PCT=-1: must be 0 to 100"},
		{"AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH", "nope", "AIBRIX_DECODE_TOKEN_LOAD_OUTPUT_GROWTH=nope: must be true or false"},
		{"AIBRIX_TOKEN_LOAD_SHARED_LEDGER", "2", "AIBRIX_TOKEN_LOAD_SHARED_LEDGER=2: must be true or false"},
		{"AIBRIX_DECODE_SCORE_POLICY", "prefix_cache", "AIBRIX_DECODE_SCORE_POLICY=prefix_cache: " + decodePolicyRule},
		{"AIBRIX_KV_CONNECTOR_TYPE", "rdma", "AIBRIX_KV_CONNECTOR_TYPE=rdma: must be one of shfs, nixl"},
		{"AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD", "-1", "AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD=-1: must be positive"},
		// AIBrix's LoadEnvFloat / LoadEnvInt discard values ≤ 0 too (they keep the default).
		{"AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD", "0", "AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD=0: must be positive"},
		{"AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD", "0", "AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD=0: must be positive"},
		{"AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD", "0", "AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD=0: must be positive"},
		{"AIBRIX_DECODE_LB_WEIGHT_RUNNING", "0", "AIBRIX_DECODE_LB_WEIGHT_RUNNING=0: must be positive"},
		{"AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT", "0", "AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT=0: must be positive"},
		{"AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "0", "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR=0: must be positive"},
		{"AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD", "x", "AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD=x: must be a number"},
		{"AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD", "-2048", "AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD=-2048: must be positive"},
		{"AIBRIX_DECODE_SCORE_RATIO_THRESHOLD", "0", "AIBRIX_DECODE_SCORE_RATIO_THRESHOLD=0: must be positive"},
		{"AIBRIX_DECODE_LB_WEIGHT_RUNNING", "-1", "AIBRIX_DECODE_LB_WEIGHT_RUNNING=-1: must be positive"},
		{"AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT", "Inf", "AIBRIX_DECODE_LB_WEIGHT_THROUGHPUT=Inf: must be a number"},
		{"AIBRIX_TRT_MACHINE_ID", "1024", "AIBRIX_TRT_MACHINE_ID=1024: must be in [0, 1024)"},
		{"AIBRIX_TRT_MACHINE_ID", "-1", "AIBRIX_TRT_MACHINE_ID=-1: must be in [0, 1024)"},
		{"AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT", "-1", "AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT=-1: must be 0 (disabled) or positive"},
		{"AIBRIX_DECODE_RESPONSE_TIMEOUT", "ten", "AIBRIX_DECODE_RESPONSE_TIMEOUT=ten: must be a whole number"},
		{"AIBRIX_DECODE_STREAM_IDLE_TIMEOUT", "-5", "AIBRIX_DECODE_STREAM_IDLE_TIMEOUT=-5: must be 0 (disabled) or positive"},
		{"AIBRIX_DECODE_ABORT_TIMEOUT", "-3", "AIBRIX_DECODE_ABORT_TIMEOUT=-3: must be 0 (disabled) or positive"},
		{"AIBRIX_DECODE_ABORT_TIMEOUT", "9999999999999", "AIBRIX_DECODE_ABORT_TIMEOUT=9999999999999: is too large"},
		{"AIBRIX_DECODE_ABORT_RETRY_DELAY", "-2", "AIBRIX_DECODE_ABORT_RETRY_DELAY=-2: must be 0 or more"},
		{"AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "bpe", "AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE=bpe: must be one of character, tiktoken"},
		{"AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "0", "AIBRIX_PREFIX_CACHE_BLOCK_SIZE=0: must be positive"},
		{"AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS", "0", "AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS=0: must be positive"},
		{"AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "-1", "AIBRIX_PREFIX_CACHE_BLOCK_NUMBER=-1: must be positive"},
		{"AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "-1", "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR=-1: must be positive"},
		{"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS", "0", "AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS=0: must be positive"},
		{"ROUTING_ALGORITHM", "pd, random", "ROUTING_ALGORITHM=pd, random: must name a registered routing strategy"},
		{"TANDEM_PD_HANDOFF", "proxy", "TANDEM_PD_HANDOFF=proxy: must be one of auto, sidecar, epp"},
		{"TANDEM_SLO_TTFT_MS", "-1", "TANDEM_SLO_TTFT_MS=-1: must be 0 (disabled) or positive"},
		{"TANDEM_SLO_TPOT_MS", "12.5", "TANDEM_SLO_TPOT_MS=12.5: must be a whole number"},
		{"TANDEM_ADVISOR_WINDOW_SECONDS", "0", "TANDEM_ADVISOR_WINDOW_SECONDS=0: must be positive"},
		{"TANDEM_PAIR_MATCH_LABELS", "version,,rev", "TANDEM_PAIR_MATCH_LABELS=version,,rev: must be a comma-separated list of label keys (such as disaggregatedset.x-k8s.io/revision), or none (an empty key: two commas in a row, or one at an end)"},
		{"TANDEM_PAIR_MATCH_LABELS", "rev,rev", "TANDEM_PAIR_MATCH_LABELS=rev,rev: must be a comma-separated list of label keys (such as disaggregatedset.x-k8s.io/revision), or none (\"rev\" is named twice)"},
		{"TANDEM_PD_KV_HOLD_TIMEOUT_SECONDS", "0", "TANDEM_PD_KV_HOLD_TIMEOUT_SECONDS=0: must be positive"},
		{"TANDEM_OUTLIER_DETECTION", "on", "TANDEM_OUTLIER_DETECTION=on: must be true or false"},
		{"TANDEM_OUTLIER_CONSECUTIVE_5XX", "-1", "TANDEM_OUTLIER_CONSECUTIVE_5XX=-1: must be 0 or more"},
		{"TANDEM_OUTLIER_CONSECUTIVE_GATEWAY_FAILURE", "2.5", "TANDEM_OUTLIER_CONSECUTIVE_GATEWAY_FAILURE=2.5: must be a whole number"},
		{"TANDEM_OUTLIER_INTERVAL_MS", "0", "TANDEM_OUTLIER_INTERVAL_MS=0: must be positive"},
		{"TANDEM_OUTLIER_BASE_EJECTION_TIME_MS", "10s", "TANDEM_OUTLIER_BASE_EJECTION_TIME_MS=10s: must be a whole number"},
		{"TANDEM_OUTLIER_MAX_EJECTION_TIME_MS", "0", "TANDEM_OUTLIER_MAX_EJECTION_TIME_MS=0: must be positive"},
		{"TANDEM_OUTLIER_MAX_EJECTION_PERCENT", "101", "TANDEM_OUTLIER_MAX_EJECTION_PERCENT=101: must be 0 to 100"},
		{"TANDEM_OUTLIER_RECENT_FAILURE_MS", "-1", "TANDEM_OUTLIER_RECENT_FAILURE_MS=-1: must be 0 or more"},
		{"TANDEM_PD_PREFILL_RETRY", "yes", "TANDEM_PD_PREFILL_RETRY=yes: must be true or false"},
		{"TANDEM_PD_TRANSFER_HEADER", "on", "TANDEM_PD_TRANSFER_HEADER=on: must be true or false"},
		{"TANDEM_PD_TRANSFER_PROOF", "hard", "TANDEM_PD_TRANSFER_PROOF=hard: must be one of lenient, strict"},
		{"TANDEM_PD_RETRY_BUDGET_PERCENT", "-5", "TANDEM_PD_RETRY_BUDGET_PERCENT=-5: must be 0 to 100"},
		{"TANDEM_PD_RETRY_MIN_CONCURRENCY", "-1", "TANDEM_PD_RETRY_MIN_CONCURRENCY=-1: must be 0 or more"},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.name] = true
		g, _, err := FromEnv(envOf(map[string]string{c.name: c.value}))
		if err == nil || err.Error() != c.want {
			t.Errorf("%s=%s: error %v, want %q", c.name, c.value, err, c.want)
			continue
		}
		var p *Problem
		if !errors.As(err, &p) || p.Field != c.name || p.Value != c.value {
			t.Errorf("%s: errors.As gives %+v", c.name, p)
		}
		_ = g
	}
	for _, v := range Vars {
		if !covered[v.Name] && !v.KeepDefault {
			t.Errorf("%s has no invalid-value case", v.Name)
		}
	}
}

// The seed: "An unknown value keeps the default" / "is logged and falls back to context_first".
func TestEnvUnknownValueKeepsDefault(t *testing.T) {
	g, warns, err := FromEnv(envOf(map[string]string{
		"AIBRIX_BUCKET_SERVE_MODE":  "latency",
		"AIBRIX_TRT_SCHEDULE_STYLE": "parallel",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if g.PD.BucketServeMode != "throughput" || g.PD.TRTScheduleStyle != "context_first" {
		t.Errorf("got %q %q, want the defaults", g.PD.BucketServeMode, g.PD.TRTScheduleStyle)
	}
	want := []string{
		"AIBRIX_BUCKET_SERVE_MODE=latency: must be one of throughput, rps; keeping throughput",
		"AIBRIX_TRT_SCHEDULE_STYLE=parallel: must be one of context_first, generation_first; keeping context_first",
	}
	if len(warns) != len(want) {
		t.Fatalf("warnings %v, want %v", warns, want)
	}
	for i := range want {
		if warns[i].String() != want[i] {
			t.Errorf("warning %q, want %q", warns[i], want[i])
		}
	}
}

func TestEnvReportsEveryErrorAtOnce(t *testing.T) {
	_, _, err := FromEnv(envOf(map[string]string{
		"AIBRIX_TOKEN_LOAD_KV_WEIGHT": "-1",
		"AIBRIX_TRT_MACHINE_ID":       "2048",
		"AIBRIX_MIN_MATCH_PCT":        "150",
	}))
	want := "3 configuration problems:\n" +
		"  AIBRIX_TOKEN_LOAD_KV_WEIGHT=-1: must be positive\n" +
		"  AIBRIX_MIN_MATCH_PCT=150: must be 0 to 100\n" +
		"  AIBRIX_TRT_MACHINE_ID=2048: must be in [0, 1024)"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
	var errs Errors
	if !errors.As(err, &errs) || len(errs) != 3 {
		t.Errorf("want Errors with 3 problems, got %#v", err)
	}
}

func TestBucketServeNeedsBucketing(t *testing.T) {
	_, _, err := FromEnv(envOf(map[string]string{"AIBRIX_BUCKET_SERVE": "true"}))
	if err == nil || !strings.HasPrefix(err.Error(), "AIBRIX_BUCKET_SERVE=true: requires AIBRIX_PROMPT_LENGTH_BUCKETING=true") {
		t.Fatalf("got %v", err)
	}
	g, _, err := FromEnv(envOf(map[string]string{"AIBRIX_BUCKET_SERVE": "true", "AIBRIX_PROMPT_LENGTH_BUCKETING": "true"}))
	if err != nil || !g.PD.BucketServe || !g.PD.PromptLengthBucketing {
		t.Fatalf("both on: %v %+v", err, g.PD)
	}
}

func TestUnknownEnv(t *testing.T) {
	got := UnknownEnv([]string{"PATH=/bin", "AIBRIX_PROMPT_LENGTH_BUCKETING=true", "AIBRIX_PROMPT_LENGTH_BUCKETNG=true", "TANDEM_PD_HANDOF=epp",
		"TANDEM_REDIS_ADDR=redis:6379", "TANDEM_REDIS_PASSWORD=x", "TANDEM_REDIS_TLS=true"}) // the last three: cmd/epp's flags
	if len(got) != 2 || got[0].Field != "AIBRIX_PROMPT_LENGTH_BUCKETNG" || got[1].Field != "TANDEM_PD_HANDOF" {
		t.Fatalf("got %v", got)
	}
	for i, want := range []string{"did you mean AIBRIX_PROMPT_LENGTH_BUCKETING?", "did you mean TANDEM_PD_HANDOFF?"} {
		if !strings.Contains(got[i].Message, want) {
			t.Errorf("%s: %q lacks %q", got[i].Field, got[i].Message, want)
		}
	}
	// A name close to none says where the list is, and suggests nothing.
	far := UnknownEnv([]string{"TANDEM_SOMETHING_ELSE_ENTIRELY=1"})
	if len(far) != 1 || strings.Contains(far[0].Message, "did you mean") || !strings.Contains(far[0].Message, "docs/configuration.md") {
		t.Fatalf("far: %v", far)
	}
}

func TestVarsAreUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range Vars {
		for _, k := range []string{"env:" + v.Name, "key:" + v.Key, "profile:" + v.ProfileKey} {
			if k == "profile:" {
				continue
			}
			if seen[k] {
				t.Errorf("%s defined twice", k)
			}
			seen[k] = true
		}
		if v.Description == "" || v.Rule == "" || v.Type == "" {
			t.Errorf("%s lacks a description, rule or type", v.Name)
		}
	}
	// Every routingConfig.pd field has exactly one variable, and the reverse.
	for k := range pdOverrideFields {
		if _, ok := varByProfileKey(k); !ok {
			t.Errorf("PDOverrides.%s has no variable with that ProfileKey", k)
		}
	}
	for _, v := range Vars {
		if _, ok := pdOverrideFields[v.ProfileKey]; v.ProfileKey != "" && !ok {
			t.Errorf("%s: ProfileKey %q is not a PDOverrides field", v.Name, v.ProfileKey)
		}
	}
}
