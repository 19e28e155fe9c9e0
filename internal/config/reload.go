package config

// restartOnly are the gateway settings Tandem reads once, when it builds the components
// that hold them (the prefix index, the scraper, the hand-off adapters, the token-load
// session table, the shared ledger, passive health, the retry budget): a --config-file reload
// cannot change them. Every other
// setting is read per request, through the resolver a reload replaces.
var restartOnly = []string{
	"AIBRIX_KV_CONNECTOR_TYPE",
	"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS",
	"AIBRIX_PREFIX_CACHE_BLOCK_NUMBER",
	"AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS",
	"AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE",
	"AIBRIX_TOKEN_LOAD_MAX_SESSIONS",
	"AIBRIX_TOKEN_LOAD_SHARED_LEDGER",
	"AIBRIX_TRT_MACHINE_ID",
	"AIBRIX_TRT_SCHEDULE_STYLE",
	// Passive health and the retry budget are built once with the ext_proc server.
	"TANDEM_OUTLIER_DETECTION",
	"TANDEM_OUTLIER_CONSECUTIVE_5XX",
	"TANDEM_OUTLIER_CONSECUTIVE_GATEWAY_FAILURE",
	"TANDEM_OUTLIER_INTERVAL_MS",
	"TANDEM_OUTLIER_BASE_EJECTION_TIME_MS",
	"TANDEM_OUTLIER_MAX_EJECTION_TIME_MS",
	"TANDEM_OUTLIER_MAX_EJECTION_PERCENT",
	"TANDEM_OUTLIER_RECENT_FAILURE_MS",
	"TANDEM_PD_PREFILL_RETRY",
	"TANDEM_PD_RETRY_BUDGET_PERCENT",
	"TANDEM_PD_RETRY_MIN_CONCURRENCY",
	// The pool source reads each pod's revision once, when it starts.
	"TANDEM_PAIR_MATCH_LABELS",
}

// RestartOnly lists the settings, by variable name, that differ between the running
// configuration and a reloaded one but take effect only at the next start.
func RestartOnly(running, reloaded Gateway) []string {
	var out []string
	for _, name := range restartOnly {
		v, ok := VarByName(name)
		if ok && v.Value(&running) != v.Value(&reloaded) {
			out = append(out, name)
		}
	}
	return out
}
