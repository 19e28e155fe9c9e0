// Package telemetry owns Tandem's own Prometheus metrics: the seed's gateway_* and pd_* series,
// and tandem_* series for decisions, latency, streams, scrapes and the pool. It registers on
// the one registry it is given (never the global one), keeps label sets bounded, and drops a
// pod's series when the pod leaves. It must not decide or route anything.
package telemetry

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/proof"
)

// Outcome is how a request was routed, a bounded label value of tandem_decisions_total.
type Outcome string

// Decision outcomes.
const (
	OutcomePD       Outcome = "pd"       // a prefill/decode pair
	OutcomeCombined Outcome = "combined" // a combined (standard) pod inside the PD strategy
	OutcomeSingle   Outcome = "single"   // one pod by a non-PD strategy
	OutcomeLocal    Outcome = "local"    // a decode pod running the whole request (selective disaggregation)
	OutcomeError    Outcome = "error"    // no destination; the client got an error
)

// otherValue replaces label values past a label's cardinality cap.
const otherValue = "other"

// Caps on distinct values of labels whose values come from requests or configuration.
const (
	maxModels  = 64
	maxSmall   = 32 // strategies, steps, statuses, classes, phases, results, sources
	maxPlugins = 64
)

// Def describes one metric Tandem exports; docs/metrics.md is checked against the registry.
type Def struct {
	Name   string
	Type   string // counter, gauge, histogram
	Labels []string
	Help   string
}

// Metrics is Tandem's set of Prometheus metrics. All methods are safe for concurrent use.
type Metrics struct {
	defs []Def

	// The seed's.
	requestModelFail    *prometheus.CounterVec
	prefillSuccess      *prometheus.CounterVec
	prefillFail         *prometheus.CounterVec
	pdPrefillFailure    *prometheus.CounterVec
	pdDecodeAbort       *prometheus.CounterVec
	pdPrefillRelease    *prometheus.CounterVec
	pdStrandedKV        *prometheus.CounterVec
	pdDecodeWatchdog    *prometheus.CounterVec
	tokenLoadActive     *prometheus.GaugeVec
	tokenLoadKV         *prometheus.GaugeVec
	tokenLoadDecode     *prometheus.GaugeVec
	bucketBand          *prometheus.CounterVec
	bucketPromptTokens  *prometheus.CounterVec
	bucketBandMax       *prometheus.GaugeVec
	selectedPrefillPods *prometheus.CounterVec
	selectedDecodePods  *prometheus.CounterVec
	pdTransfer          *prometheus.CounterVec

	// Tandem's.
	decisions        *prometheus.CounterVec
	pickDuration     *prometheus.HistogramVec
	pluginDuration   *prometheus.HistogramVec
	streamsOpen      prometheus.Gauge
	streamsTotal     prometheus.Counter
	requestBodyBytes prometheus.Histogram
	ttft             *prometheus.HistogramVec
	interToken       *prometheus.HistogramVec
	predRatio        *prometheus.HistogramVec
	predAbsError     *prometheus.HistogramVec
	scrapeDuration   *prometheus.HistogramVec
	scrapeLast       *prometheus.GaugeVec
	scrapeErrors     *prometheus.CounterVec
	scrapeStale      *prometheus.GaugeVec
	configErrors     *prometheus.CounterVec
	poolEndpoints    *prometheus.GaugeVec
	pdRolesets       *prometheus.GaugeVec
	endpointRunning  *prometheus.GaugeVec
	endpointWaiting  *prometheus.GaugeVec
	endpointKVUsage  *prometheus.GaugeVec
	panics           *prometheus.CounterVec
	fieldsRemoved    *prometheus.CounterVec
	outlierEjected   *prometheus.GaugeVec
	outlierEjections *prometheus.CounterVec
	outlierReturns   *prometheus.CounterVec
	outlierOverflow  *prometheus.CounterVec
	outlierDuration  *prometheus.HistogramVec
	outlierFiltered  *prometheus.CounterVec
	prefillRetries   *prometheus.CounterVec
	redisRejected    *prometheus.CounterVec
	bufferedBody     prometheus.GaugeFunc
	bufferedSource   atomic.Pointer[func() float64]
	configReload     configReload
	caps             map[string]*labelCap
	// servedModels are models the pool answered successfully, for pools whose pods do not
	// name the model they serve (ModelServed).
	servedModels *labelCap
	podsMu       sync.Mutex
	pods         map[string][2]string // pod key -> namespace, name, as of the last snapshot
	poolSeen     bool                 // PoolChanged ran at least once: pods is the pool
}

// New builds Tandem's metrics and registers them on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, fmt.Errorf("telemetry.New: a prometheus.Registerer is required (Tandem never uses the global registry)")
	}
	m := &Metrics{pods: map[string][2]string{}, servedModels: newLabelCap(maxModels), caps: map[string]*labelCap{
		"model": newLabelCap(maxModels), "plugin": newLabelCap(maxPlugins), "engine": newLabelCap(maxSmall),
		"strategy": newLabelCap(maxSmall), "step": newLabelCap(maxSmall), "status": newLabelCap(maxSmall),
		"class": newLabelCap(maxSmall), "stage": newLabelCap(maxSmall), "result": newLabelCap(maxSmall),
		"phase": newLabelCap(maxSmall), "end": newLabelCap(maxSmall), "source": newLabelCap(maxSmall), "where": newLabelCap(maxSmall),
		"field": newLabelCap(maxSmall), "kind": newLabelCap(maxSmall), "reason": newLabelCap(maxSmall),
	}}
	podLabels := []string{"namespace", "pod_name"}
	epLabels := []string{"namespace", "pod_name", "port"}

	m.requestModelFail = m.counterVec("gateway_request_model_fail_total", "Requests that failed, by model, failure status, failure class (a PD prefill failure's: timeout, http_status, …; empty otherwise) and HTTP status code (the seed's name).", "model", "status", "class", "status_code")
	m.prefillSuccess = m.counterVec("gateway_prefill_request_success_total", "Prefill legs that succeeded (the seed's name).", "status", "status_code")
	m.prefillFail = m.counterVec("gateway_prefill_request_fail_total", "Prefill legs or pair selections that failed, by failure status and HTTP status code (the seed's name).", "status", "status_code")
	m.pdPrefillFailure = m.counterVec("gateway_pd_prefill_failure_total", "Terminal prefill-leg failures in PD fail-fast, by failure class and whether the decode leg had responded (stage).", "class", "stage")
	m.pdDecodeAbort = m.counterVec("gateway_pd_decode_abort_total", "Decode aborts sent (or skipped) after a prefill failure or watchdog, by cause and result.", "prefill_failure_class", "result")
	m.pdDecodeWatchdog = m.counterVec("gateway_pd_decode_watchdog_total", "Decode watchdog firings, by phase (first_response, stream_idle).", "phase")
	m.pdPrefillRelease = m.counterVec("tandem_pd_prefill_release_total", "epp hand-off: requests that ended before the decode leg's first token while a prefill pod may hold their KV, by engine and what Tandem did (sent: the prefill pod acknowledged an abort; failed: the abort failed; unsupported: the engine has no call to release it).", "engine", "result")
	m.pdStrandedKV = m.counterVec("tandem_pd_stranded_kv_seconds_total", "epp hand-off: seconds prefill pods held the KV of finished prefill legs, by pod and how the hold ended (consumed: the decode leg's first token came; released: an abort freed it; expired: TANDEM_PD_KV_HOLD_TIMEOUT_SECONDS passed).", "namespace", "pod_name", "end")
	m.tokenLoadActive = m.gaugeVec("pd_token_load_active_tokens", "Prefill token-load ledger: tokens charged to a prefill pod whose prefill call has not returned.", podLabels...)
	m.tokenLoadKV = m.gaugeVec("pd_token_load_kv_tokens", "Prefill token-load ledger: tokens charged to a prefill pod whose request has not completed.", podLabels...)
	m.tokenLoadDecode = m.gaugeVec("pd_token_load_decode_tokens", "Decode token-load ledger: prompt tokens held by a decode pod (decode policy token_load).", podLabels...)
	m.bucketBand = m.counterVec("pd_bucket_serve_band_total", "Requests whose prompt length fell in a bucket-serve band, by the band's roleset.", "roleset")
	m.bucketPromptTokens = m.counterVec("pd_bucket_serve_prompt_tokens_total", "Prompt tokens of requests routed by a bucket-serve band, by roleset.", "roleset")
	m.bucketBandMax = m.gaugeVec("pd_bucket_serve_band_max", "Highest prompt-length upper bound among a roleset's bucket-serve bands (deleted when the roleset leaves the plan).", "roleset")
	m.selectedPrefillPods = m.counterVec("pd_selected_prefill_pod_total", "Times a pod was selected as the prefill side of a PD pair.", podLabels...)
	m.selectedDecodePods = m.counterVec("pd_selected_decode_pod_total", "Times a pod was selected as the decode side of a PD pair.", podLabels...)
	m.pdTransfer = m.counterVec("tandem_pd_transfer_total", "PD requests by the proof of their KV transfer: verified (the decode answer's cached tokens cover the prompt), recomputed (the decode pod computed the prompt again), unknown; per pod pair (namespace/name).", "result", "prefill_pod", "decode_pod")

	m.decisions = m.counterVec("tandem_decisions_total", "Routing decisions, by strategy, outcome (pd, combined, single, error) and the step that decided.", "strategy", "outcome", "step")
	m.pickDuration = m.histogramVec("tandem_pick_duration_seconds", "Time to pick a destination (the whole scheduler call), by strategy.", latencyBuckets, "strategy")
	m.pluginDuration = m.histogramVec("tandem_plugin_duration_seconds", "Time spent in one scheduling plugin (filter, scorer, picker) per call.", latencyBuckets, "plugin")
	m.streamsOpen = m.gauge("tandem_extproc_streams_open", "ext_proc streams currently open.")
	m.streamsTotal = m.counter("tandem_extproc_streams_total", "ext_proc streams opened since start.")
	m.requestBodyBytes = m.histogram("tandem_request_body_bytes", "Size of request bodies Tandem parsed, in bytes.", prometheus.ExponentialBuckets(256, 4, 9))
	m.predRatio = m.histogramVec("tandem_ttft_prediction_ratio", "Observed ÷ predicted TTFT of each request routed by a predictive policy (pd-predictive), by route kind (pd, whole): 1 is exact, above 1 the prediction was too low.", predictionRatioBuckets, "kind")
	m.predAbsError = m.histogramVec("tandem_ttft_prediction_error_seconds", "Absolute difference between observed and predicted TTFT of each request routed by a predictive policy, by route kind (pd, whole).", ttftBuckets, "kind")
	m.ttft = m.histogramVec("tandem_time_to_first_token_seconds", "Time from the request reaching Tandem to the first response body chunk, by model and the serving pod's role.", ttftBuckets, "model", "role")
	m.interToken = m.histogramVec("tandem_inter_token_latency_seconds", "Time between response body chunks of a streamed response, by model and the serving pod's role.", itlBuckets, "model", "role")
	m.scrapeDuration = m.histogramVec("tandem_scrape_duration_seconds", "Time to scrape and parse one model server's metrics, by engine.", scrapeBuckets, "engine")
	m.scrapeLast = m.gaugeVec("tandem_scrape_last_duration_seconds", "Duration of the last scrape of an endpoint, successful or not.", epLabels...)
	m.scrapeErrors = m.counterVec("tandem_scrape_errors_total", "Failed metric scrapes, by endpoint and reason (timeout, refused, connect, http_status, too_large, parse).", append(epLabels, "reason")...)
	m.scrapeStale = m.gaugeVec("tandem_scrape_stale", "1 while an endpoint's engine metrics are stale (no good scrape within the staleness threshold), else 0.", epLabels...)
	m.configErrors = m.counterVec("tandem_config_errors_total", "Bad per-pod configuration (annotations, labels) that Tandem ignored, by pod and source.", "namespace", "pod_name", "source")
	m.poolEndpoints = m.gaugeVec("tandem_pool_endpoints", "Endpoints in the pool snapshot, by role (prefill, decode, standard).", "role")
	m.pdRolesets = m.gaugeVec("tandem_pd_rolesets", "Rolesets in the pool by state: complete (has prefill and decode endpoints) or incomplete (only one side). Each revision of a roleset (its TANDEM_PAIR_MATCH_LABELS values) counts as one.", "state")
	m.endpointRunning = m.gaugeVec("tandem_endpoint_running_requests", "Requests running in the engine, as last scraped.", append(epLabels, "role")...)
	m.endpointWaiting = m.gaugeVec("tandem_endpoint_waiting_requests", "Requests queued in the engine, as last scraped.", append(epLabels, "role")...)
	m.endpointKVUsage = m.gaugeVec("tandem_endpoint_kv_cache_usage_ratio", "KV-cache utilisation of the engine (0..1), as last scraped.", append(epLabels, "role")...)
	m.configReload = m.newConfigReload()

	m.panics = m.counterVec("tandem_panics_recovered_total", "Panics recovered while handling a request (the request failed, the process went on), by where they happened.", "where")
	m.fieldsRemoved = m.counterVec("tandem_client_pd_fields_removed_total", "Client-sent PD control fields (kv_transfer_params, bootstrap_*, disaggregated_params, disagg_prefill_resp) removed from request bodies, by field.", "field")
	m.outlierEjected = m.gaugeVec("tandem_outlier_ejected", "1 while passive health (outlier detection) keeps an endpoint out of rotation, else 0.", append(epLabels, "role")...)
	m.outlierEjections = m.counterVec("tandem_outlier_ejections_total", "Endpoints ejected by passive health, by reason (consecutive_5xx, consecutive_gateway_failure, connection_refused, failed_after_return, not_serving_yet: a refused port before the endpoint ever answered, out until it answers).", append(epLabels, "role", "reason")...)
	m.outlierReturns = m.counterVec("tandem_outlier_returns_total", "Ejected endpoints back in rotation (ejection time passed and a probe succeeded), by the probe that succeeded (scrape, health_probe).", append(epLabels, "role", "probe")...)
	m.outlierOverflow = m.counterVec("tandem_outlier_ejections_overflow_total", "Ejections passive health refused so as not to eject everything, by role, the ejection's reason and the rule that refused it (max_ejection_percent, last_serving_path).", "role", "reason", "overflow")
	m.outlierDuration = m.histogramVec("tandem_outlier_ejection_duration_seconds", "How long an endpoint stayed ejected, observed when it returned, by role.", ejectionBuckets, "role")
	m.outlierFiltered = m.counterVec("tandem_outlier_filtered_decisions_total", "Routing decisions that left candidates out for passive health, by why (ejected, recent_failure).", "state")
	m.prefillRetries = m.counterVec("tandem_pd_prefill_retries_total", "Pair-level retries of failed prefill legs (epp hand-off), by result: recovered, failed (every attempt failed), budget_exhausted, no_candidate (not retried).", "result")
	m.redisRejected = m.counterVec("tandem_redis_values_rejected_total", "Values read from Redis (the shared ledger) that were not finite or outside their bound and were ignored, by kind (decode_charge, signal, prefill_busy_until, heartbeat: one ahead of the skew allowance, counted as now; replicas: live replicas past the per-read bound).", "kind")
	m.def("tandem_extproc_buffered_body_bytes", "gauge", "Request-body bytes the open ext_proc streams hold now, against --max-buffered-body-bytes.", nil)
	m.bufferedBody = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tandem_extproc_buffered_body_bytes",
		Help: "Request-body bytes the open ext_proc streams hold now, against --max-buffered-body-bytes."}, func() float64 {
		if f := m.bufferedSource.Load(); f != nil {
			return (*f)()
		}
		return 0
	})

	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("telemetry.New: register: %w", err)
		}
	}
	return m, nil
}

var (
	latencyBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}
	ttftBuckets    = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160}
	// predictionRatioBuckets: observed ÷ predicted from 1/8 to 8, in half doublings.
	predictionRatioBuckets = prometheus.ExponentialBuckets(0.125, math.Sqrt2, 13)
	itlBuckets             = []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1, 2.5}
	scrapeBuckets          = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
	ejectionBuckets        = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800}
)

// Defs lists every metric Tandem exports, in registration order.
func (m *Metrics) Defs() []Def { return append([]Def(nil), m.defs...) }

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requestModelFail, m.prefillSuccess, m.prefillFail, m.pdPrefillFailure, m.pdDecodeAbort,
		m.pdDecodeWatchdog, m.pdPrefillRelease, m.pdStrandedKV, m.tokenLoadActive, m.tokenLoadKV, m.tokenLoadDecode, m.bucketBand, m.bucketPromptTokens,
		m.bucketBandMax, m.selectedPrefillPods, m.selectedDecodePods, m.pdTransfer, m.decisions, m.pickDuration, m.pluginDuration,
		m.streamsOpen, m.streamsTotal, m.requestBodyBytes, m.ttft, m.interToken, m.predRatio, m.predAbsError, m.scrapeDuration, m.scrapeLast, m.scrapeErrors,
		m.scrapeStale, m.configErrors, m.poolEndpoints, m.pdRolesets, m.endpointRunning, m.endpointWaiting, m.endpointKVUsage,
		m.panics, m.fieldsRemoved, m.outlierEjected, m.outlierEjections, m.outlierReturns, m.outlierOverflow, m.outlierDuration,
		m.outlierFiltered, m.prefillRetries, m.redisRejected, m.bufferedBody,
		m.configReload.total, m.configReload.applied}
}

func (m *Metrics) def(name, typ, help string, labels []string) {
	m.defs = append(m.defs, Def{Name: name, Type: typ, Labels: append([]string(nil), labels...), Help: help})
}

func (m *Metrics) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	m.def(name, "counter", help, labels)
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func (m *Metrics) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	m.def(name, "gauge", help, labels)
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

func (m *Metrics) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	m.def(name, "histogram", help, labels)
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}

func (m *Metrics) counter(name, help string) prometheus.Counter {
	m.def(name, "counter", help, nil)
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func (m *Metrics) gauge(name, help string) prometheus.Gauge {
	m.def(name, "gauge", help, nil)
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

func (m *Metrics) histogram(name, help string, buckets []float64) prometheus.Histogram {
	m.def(name, "histogram", help, nil)
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// labelCap bounds the distinct values of one label: past max, new values become "other".
type labelCap struct {
	mu   sync.RWMutex
	seen map[string]struct{}
	max  int
}

func newLabelCap(max int) *labelCap { return &labelCap{seen: map[string]struct{}{}, max: max} }

func (c *labelCap) has(v string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.seen[v]
	return ok
}

func (c *labelCap) value(v string) string {
	c.mu.RLock()
	_, ok := c.seen[v]
	c.mu.RUnlock()
	if ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[v]; ok {
		return v
	}
	if len(c.seen) >= c.max {
		return otherValue
	}
	c.seen[v] = struct{}{}
	return v
}

func (m *Metrics) bound(label, v string) string {
	if v == "" {
		v = "unknown"
	}
	if !utf8.ValidString(v) {
		// The Prometheus client panics on such a label value. Request strings are made safe
		// where they enter (request.ParseWith); this keeps any other source from killing the process.
		v = strings.ToValidUTF8(v, "\uFFFD")
	}
	return m.caps[label].value(v)
}

func role(r pool.Role) string {
	switch r {
	case pool.RolePrefill, pool.RoleDecode, pool.RoleStandard:
		return string(r)
	}
	return string(pool.RoleStandard)
}

// ---- Request path (ext_proc server, picker) ----

// StreamOpened counts an ext_proc stream; call the returned function when it ends (idempotent).
func (m *Metrics) StreamOpened() (closed func()) {
	m.streamsTotal.Inc()
	m.streamsOpen.Inc()
	var once sync.Once
	return func() { once.Do(m.streamsOpen.Dec) }
}

// RequestBody records the size of a request body Tandem parsed.
func (m *Metrics) RequestBody(bytes int) { m.requestBodyBytes.Observe(float64(bytes)) }

// Decision records one routing decision: the strategy, its outcome, the step that decided
// (e.g. the seed's cascade step), and how long the pick took.
func (m *Metrics) Decision(strategy string, outcome Outcome, step string, took time.Duration) {
	switch outcome {
	case OutcomePD, OutcomeCombined, OutcomeSingle, OutcomeLocal, OutcomeError:
	default:
		outcome = otherValue
	}
	strategy = m.bound("strategy", strategy)
	m.decisions.WithLabelValues(strategy, string(outcome), m.bound("step", step)).Inc()
	m.pickDuration.WithLabelValues(strategy).Observe(took.Seconds())
}

// PluginLatency records one call of a scheduling plugin.
func (m *Metrics) PluginLatency(plugin string, took time.Duration) {
	m.pluginDuration.WithLabelValues(m.bound("plugin", plugin)).Observe(took.Seconds())
}

// ModelLabel is the model label of a request: the model's name when the pool serves it
// (declared: a pod of the pool names it; or the pool answered it successfully before, see
// ModelServed), else "other". A client inventing model names adds one label value, not one per
// name; the names kept are at most 64.
func (m *Metrics) ModelLabel(model string, declared bool) string {
	if !declared && !m.servedModels.has(model) {
		return otherValue
	}
	return m.bound("model", model)
}

// ModelServed records that the pool answered a request for model successfully: for pools
// whose pods do not name their model, that is how a name becomes a label value.
func (m *Metrics) ModelServed(model string) { m.servedModels.value(model) }

// PanicRecovered counts a recovered panic; where is a bounded label such as "extproc_stream".
func (m *Metrics) PanicRecovered(where string) {
	m.panics.WithLabelValues(m.bound("where", where)).Inc()
}

// RedisValuesRejected counts n values of a kind read from Redis and refused.
func (m *Metrics) RedisValuesRejected(kind string, n int) {
	m.redisRejected.WithLabelValues(m.bound("kind", kind)).Add(float64(n))
}

// ClientFieldsRemoved counts client-sent PD control fields removed from one request's body.
func (m *Metrics) ClientFieldsRemoved(fields []string) {
	for _, f := range fields {
		m.fieldsRemoved.WithLabelValues(m.bound("field", f)).Inc()
	}
}

// BufferedBodyBytesFrom makes tandem_extproc_buffered_body_bytes read f.
func (m *Metrics) BufferedBodyBytesFrom(f func() float64) { m.bufferedSource.Store(&f) }

// TimeToFirstToken records the time from the request to the first response body chunk.
func (m *Metrics) TimeToFirstToken(model string, r pool.Role, d time.Duration) {
	m.ttft.WithLabelValues(m.bound("model", model), role(r)).Observe(d.Seconds())
}

// TTFTPrediction records a predictive policy's TTFT prediction against the observed TTFT
// (it implements latency.Observer). endpoint is not a label: the trace shows per-pod error.
func (m *Metrics) TTFTPrediction(kind, _ string, predicted, observed time.Duration) {
	if predicted <= 0 || observed <= 0 {
		return
	}
	kind = m.bound("kind", kind)
	m.predRatio.WithLabelValues(kind).Observe(observed.Seconds() / predicted.Seconds())
	m.predAbsError.WithLabelValues(kind).Observe(math.Abs(observed.Seconds() - predicted.Seconds()))
}

// InterTokenLatency records the gap between two response body chunks of a streamed response.
func (m *Metrics) InterTokenLatency(model string, r pool.Role, d time.Duration) {
	m.interToken.WithLabelValues(m.bound("model", model), role(r)).Observe(d.Seconds())
}

// ResponseTimer turns the body chunks of one response into TTFT and inter-token latency
// observations. One per response stream; not for concurrent use.
type ResponseTimer struct {
	ttft, itl   prometheus.Observer
	start, last time.Time
}

// NewResponseTimer starts timing a response to a request that reached Tandem at start and is
// served by a pod of the given role (the decode pod for PD pairs). model is a label value
// (ModelLabel).
func (m *Metrics) NewResponseTimer(model string, r pool.Role, start time.Time) *ResponseTimer {
	model = m.bound("model", model)
	return &ResponseTimer{ttft: m.ttft.WithLabelValues(model, role(r)), itl: m.interToken.WithLabelValues(model, role(r)), start: start}
}

// BodyChunk records a response body chunk of size bytes arriving at now. The first non-empty
// chunk is the first token; the gaps between later ones are inter-token latencies (a chunk is
// what the engine flushed, one or a few tokens). Empty chunks (a bare end of stream) are ignored.
func (t *ResponseTimer) BodyChunk(now time.Time, size int) {
	if size == 0 {
		return
	}
	if t.last.IsZero() {
		t.ttft.Observe(now.Sub(t.start).Seconds())
	} else {
		t.itl.Observe(now.Sub(t.last).Seconds())
	}
	t.last = now
}

// RequestModelFail counts a failed request (gateway_request_model_fail_total), e.g.
// ("m", "pd_decode_watchdog", "", 504) or ("m", "pd_prefill_failure", "timeout", 503): status is
// the seed's (AIBrix's) label value, class the failure's bounded sub-kind ("" when none).
func (m *Metrics) RequestModelFail(model, status, class string, code int) {
	if class != "" { // no class: the label stays empty (absent), not "unknown"
		class = m.bound("class", class)
	}
	m.requestModelFail.WithLabelValues(m.bound("model", model), m.bound("status", status), class, strconv.Itoa(code)).Inc()
}

// PrefillRequestSuccess counts a successful prefill leg, with the seed's labels
// status="pd-prefill-request-success", status_code="200".
func (m *Metrics) PrefillRequestSuccess() {
	m.prefillSuccess.WithLabelValues("pd-prefill-request-success", "200").Inc()
}

// PrefillRequestFail counts a failed prefill leg or pair selection, e.g.
// ("pd-do-prefill-request-error", 500) or ("deadline_exceeded", 504).
func (m *Metrics) PrefillRequestFail(status string, code int) {
	m.prefillFail.WithLabelValues(m.bound("status", status), strconv.Itoa(code)).Inc()
}

// PrefillFailure counts a terminal prefill failure in PD fail-fast; stage is before_response
// or after_response.
func (m *Metrics) PrefillFailure(class, stage string) {
	m.pdPrefillFailure.WithLabelValues(m.bound("class", class), m.bound("stage", stage)).Inc()
}

// DecodeAbort counts a decode abort and its result (ok, error, skipped_*).
func (m *Metrics) DecodeAbort(prefillFailureClass, result string) {
	m.pdDecodeAbort.WithLabelValues(m.bound("class", prefillFailureClass), m.bound("result", result)).Inc()
}

// PrefillRelease counts a request that ended before its decode leg's first token while its
// prefill pod may hold its KV; result is sent, failed or unsupported.
func (m *Metrics) PrefillRelease(engine, result string) {
	m.pdPrefillRelease.WithLabelValues(m.bound("engine", engine), m.bound("result", result)).Inc()
}

// StrandedKV adds the seconds a prefill pod held a finished prefill leg's KV, by how the hold
// ended (consumed, released, expired). A pod no longer in the pool is not counted: its series
// were deleted when it left, and a late hold must not bring them back.
func (m *Metrics) StrandedKV(prefill *pool.Endpoint, end string, seconds float64) {
	m.podsMu.Lock()
	defer m.podsMu.Unlock()
	if m.poolSeen {
		if _, ok := m.pods[prefill.PodKey()]; !ok {
			return
		}
	}
	m.pdStrandedKV.WithLabelValues(prefill.Namespace, prefill.Name, m.bound("end", end)).Add(seconds)
}

// DecodeWatchdog counts a decode watchdog firing in a phase (first_response, stream_idle).
func (m *Metrics) DecodeWatchdog(phase string) {
	m.pdDecodeWatchdog.WithLabelValues(m.bound("phase", phase)).Inc()
}

// Transfer counts one PD request's transfer proof for its pod pair (proof.Observer).
func (m *Metrics) Transfer(result proof.Result, prefillPod, decodePod string) {
	m.podsMu.Lock()
	defer m.podsMu.Unlock()
	if m.poolSeen {
		// A verdict that comes after either pod left does not bring its series back.
		_, p := m.pods[prefillPod]
		_, d := m.pods[decodePod]
		if !p || !d {
			return
		}
	}
	m.pdTransfer.WithLabelValues(m.bound("result", string(result)), prefillPod, decodePod).Inc()
}

// SelectedPair counts the pods of a chosen PD pair; either may be nil.
func (m *Metrics) SelectedPair(prefill, decode *pool.Endpoint) {
	if prefill != nil {
		m.selectedPrefillPods.WithLabelValues(prefill.Namespace, prefill.Name).Inc()
	}
	if decode != nil {
		m.selectedDecodePods.WithLabelValues(decode.Namespace, decode.Name).Inc()
	}
}

// ---- Passive health and pair-level retries ----

// OutlierEjected records an endpoint ejected by passive health.
func (m *Metrics) OutlierEjected(ep *pool.Endpoint, reason string) {
	port, r := strconv.Itoa(int(ep.Port)), role(ep.Role)
	m.outlierEjected.WithLabelValues(ep.Namespace, ep.Name, port, r).Set(1)
	m.outlierEjections.WithLabelValues(ep.Namespace, ep.Name, port, r, m.bound("reason", reason)).Inc()
}

// OutlierReturned records an ejected endpoint back in rotation after `after`.
func (m *Metrics) OutlierReturned(ep *pool.Endpoint, after time.Duration, probe string) {
	port, r := strconv.Itoa(int(ep.Port)), role(ep.Role)
	m.outlierEjected.WithLabelValues(ep.Namespace, ep.Name, port, r).Set(0)
	m.outlierReturns.WithLabelValues(ep.Namespace, ep.Name, port, r, m.bound("source", probe)).Inc()
	m.outlierDuration.WithLabelValues(r).Observe(after.Seconds())
}

// OutlierOverflow records an ejection refused to keep the pool serving.
func (m *Metrics) OutlierOverflow(ep *pool.Endpoint, reason, overflow string) {
	m.outlierOverflow.WithLabelValues(role(ep.Role), m.bound("reason", reason), m.bound("result", overflow)).Inc()
}

// OutlierFiltered records a decision that left candidates out, by why (ejected, recent_failure).
func (m *Metrics) OutlierFiltered(state string) {
	m.outlierFiltered.WithLabelValues(m.bound("phase", state)).Inc()
}

// PrefillRetry records one pair-level retry decision by its result.
func (m *Metrics) PrefillRetry(result string) {
	m.prefillRetries.WithLabelValues(m.bound("result", result)).Inc()
}

// ---- Token-load ledgers and bucket serving ----

// SetTokenLoad publishes a prefill pod's ledger (pd_token_load_active_tokens / _kv_tokens).
func (m *Metrics) SetTokenLoad(namespace, pod string, active, kv float64) {
	m.tokenLoadActive.WithLabelValues(namespace, pod).Set(active)
	m.tokenLoadKV.WithLabelValues(namespace, pod).Set(kv)
}

// SetDecodeTokens publishes a decode pod's ledger (pd_token_load_decode_tokens).
func (m *Metrics) SetDecodeTokens(namespace, pod string, tokens float64) {
	m.tokenLoadDecode.WithLabelValues(namespace, pod).Set(tokens)
}

// DeleteTokenLoad drops a pod's ledger series (the janitor pruned it).
func (m *Metrics) DeleteTokenLoad(namespace, pod string) {
	l := prometheus.Labels{"namespace": namespace, "pod_name": pod}
	m.tokenLoadActive.Delete(l)
	m.tokenLoadKV.Delete(l)
	m.tokenLoadDecode.Delete(l)
}

// BucketServeBand counts a request routed by a bucket-serve band of a roleset.
func (m *Metrics) BucketServeBand(roleset string, promptTokens int) {
	m.bucketBand.WithLabelValues(roleset).Inc()
	m.bucketPromptTokens.WithLabelValues(roleset).Add(float64(promptTokens))
}

// SetBucketServeBandMax publishes the highest upper bound among a roleset's bands.
func (m *Metrics) SetBucketServeBandMax(roleset string, max int) {
	m.bucketBandMax.WithLabelValues(roleset).Set(float64(max))
}

// DropBucketServeRoleset deletes a roleset's band gauge (it was dropped from the plan).
func (m *Metrics) DropBucketServeRoleset(roleset string) {
	m.bucketBandMax.DeleteLabelValues(roleset)
}

// PodConfigError counts a bad per-pod setting (annotation or label) Tandem ignored.
func (m *Metrics) PodConfigError(namespace, pod, source string) {
	m.configErrors.WithLabelValues(namespace, pod, m.bound("source", source)).Inc()
}

// DropPod deletes every series of a pod (all its ports). PoolChanged calls it for pods that
// left the pool; call it directly when the pool is not fed through the scraper.
func (m *Metrics) DropPod(namespace, pod string) {
	l := prometheus.Labels{"namespace": namespace, "pod_name": pod}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.tokenLoadActive, m.tokenLoadKV, m.tokenLoadDecode, m.selectedPrefillPods, m.selectedDecodePods,
		m.scrapeLast, m.scrapeErrors, m.scrapeStale, m.configErrors, m.endpointRunning, m.endpointWaiting, m.endpointKVUsage,
		m.outlierEjected, m.outlierEjections, m.outlierReturns, m.pdStrandedKV} {
		v.DeletePartialMatch(l)
	}
	// The proof's pod-pair series name pods "namespace/name".
	key := namespace + "/" + pod
	m.pdTransfer.DeletePartialMatch(prometheus.Labels{"prefill_pod": key})
	m.pdTransfer.DeletePartialMatch(prometheus.Labels{"decode_pod": key})
}

// ---- metrics.Observer: what the scraper sees ----

var _ metrics.Observer = (*Metrics)(nil)

func epLabels(ep *pool.Endpoint) prometheus.Labels {
	return prometheus.Labels{"namespace": ep.Namespace, "pod_name": ep.Name, "port": strconv.Itoa(int(ep.Port))}
}

// ScrapeDone implements metrics.Observer.
func (m *Metrics) ScrapeDone(ep *pool.Endpoint, took time.Duration, errClass string) {
	port := strconv.Itoa(int(ep.Port))
	m.scrapeDuration.WithLabelValues(m.bound("engine", ep.Engine)).Observe(took.Seconds())
	m.scrapeLast.WithLabelValues(ep.Namespace, ep.Name, port).Set(took.Seconds())
	if errClass != "" {
		m.scrapeErrors.WithLabelValues(ep.Namespace, ep.Name, port, errClass).Inc()
	}
}

// EndpointSample implements metrics.Observer: the scraped load signals, per endpoint.
func (m *Metrics) EndpointSample(ep *pool.Endpoint, s *metrics.Sample) {
	port, r := strconv.Itoa(int(ep.Port)), role(ep.Role)
	m.scrapeStale.WithLabelValues(ep.Namespace, ep.Name, port).Set(0)
	setOrDelete(m.endpointRunning, s.HasRunning, s.Running, ep.Namespace, ep.Name, port, r)
	setOrDelete(m.endpointWaiting, s.HasWaiting, s.Waiting, ep.Namespace, ep.Name, port, r)
	setOrDelete(m.endpointKVUsage, s.HasKVUsage, s.KVUsage, ep.Namespace, ep.Name, port, r)
}

func setOrDelete(g *prometheus.GaugeVec, has bool, v float64, lv ...string) {
	if has {
		g.WithLabelValues(lv...).Set(v)
	} else {
		g.DeleteLabelValues(lv...)
	}
}

// EndpointStale implements metrics.Observer. A stale endpoint's load series are deleted, so
// dashboards and skew alerts never read a frozen value.
func (m *Metrics) EndpointStale(ep *pool.Endpoint, stale bool) {
	l := epLabels(ep)
	if stale {
		m.scrapeStale.With(l).Set(1)
		m.endpointRunning.DeletePartialMatch(l)
		m.endpointWaiting.DeletePartialMatch(l)
		m.endpointKVUsage.DeletePartialMatch(l)
		return
	}
	m.scrapeStale.With(l).Set(0)
}

// EndpointGone implements metrics.Observer: the endpoint's series are deleted.
func (m *Metrics) EndpointGone(ep *pool.Endpoint) {
	l := epLabels(ep)
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.scrapeLast, m.scrapeErrors, m.scrapeStale, m.endpointRunning, m.endpointWaiting, m.endpointKVUsage,
		m.outlierEjected, m.outlierEjections, m.outlierReturns} {
		v.DeletePartialMatch(l)
	}
}

// ConfigError implements metrics.Observer.
func (m *Metrics) ConfigError(ep *pool.Endpoint, source string, _ error) {
	m.PodConfigError(ep.Namespace, ep.Name, source)
}

// PoolChanged implements metrics.Observer: endpoints by role, complete and incomplete PD
// rolesets, and the series of pods that left are dropped.
func (m *Metrics) PoolChanged(snap *pool.Snapshot) {
	byRole := map[pool.Role]int{pool.RolePrefill: 0, pool.RoleDecode: 0, pool.RoleStandard: 0}
	pods := make(map[string][2]string, len(snap.Endpoints))
	for _, ep := range snap.Endpoints {
		byRole[ep.Role]++
		pods[ep.PodKey()] = [2]string{ep.Namespace, ep.Name}
	}
	for r, n := range byRole {
		m.poolEndpoints.WithLabelValues(string(r)).Set(float64(n))
	}
	// A roleset counts once per revision (its pair-match label values): mid-rollout, a
	// roleset whose new revision has only one side yet is one complete and one incomplete.
	complete, incomplete := 0, 0
	for _, g := range snap.Rolesets() {
		if g.Name == "" {
			continue // pods with a role and no roleset-name (llm-d's) form no roleset here
		}
		if g.Complete() {
			complete++
		} else {
			incomplete++
		}
	}
	m.pdRolesets.WithLabelValues("complete").Set(float64(complete))
	m.pdRolesets.WithLabelValues("incomplete").Set(float64(incomplete))

	m.podsMu.Lock()
	prev := m.pods
	m.pods, m.poolSeen = pods, true
	for key, nn := range prev {
		if _, ok := pods[key]; !ok {
			// Under the lock: StrandedKV, which checks the pool under it, cannot recreate them.
			m.pdStrandedKV.DeletePartialMatch(prometheus.Labels{"namespace": nn[0], "pod_name": nn[1]})
		}
	}
	m.podsMu.Unlock()
	for key, nn := range prev {
		if _, ok := pods[key]; !ok {
			m.DropPod(nn[0], nn[1])
		}
	}
}
