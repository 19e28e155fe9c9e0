package metrics

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Per-pod annotations that override where and what the scraper reads. They win over the
// pool-level ScrapeOptions.Dialects, which win over the built-in engine dialects.
const (
	// AnnotationMetricsPath is the HTTP path of the pod's Prometheus endpoint, e.g. "/metrics".
	AnnotationMetricsPath = "tandem.ai/metrics-path"
	// AnnotationMetricsPort is the port of the pod's Prometheus endpoint (default: the serving port).
	AnnotationMetricsPort = "tandem.ai/metrics-port"
	// AnnotationMetricsNames remaps signals to metric names: "field=spec; field=spec", where a
	// spec is `name`, `name{label="value",…}`, or alternatives joined by "|" (first present wins).
	// Fields are the Field constants, e.g. `waiting=nv_trt_llm_request_metrics{request_type="waiting"}`.
	AnnotationMetricsNames = "tandem.ai/metrics-names"
)

// Field names one signal the scraper reads; used as keys in name overrides.
type Field string

// The signals a dialect maps to engine metric names.
const (
	FieldRunning         Field = "running"                // gauge, summed over series
	FieldWaiting         Field = "waiting"                // gauge, summed over series
	FieldKVUsage         Field = "kv_usage"               // gauge 0..1, averaged over series
	FieldGenThroughput   Field = "gen_throughput"         // gauge tokens/s, summed
	FieldGenTokens       Field = "gen_tokens"             // counter; throughput derived between scrapes when no gauge
	FieldPromptTokens    Field = "prompt_tokens"          // counter of prompt tokens processed; a new pod's mean prompt
	FieldPrefillTime     Field = "prefill_time"           // histogram, seconds
	FieldQueueTime       Field = "queue_time"             // histogram, seconds waiting in the engine's queue
	FieldTTFT            Field = "ttft"                   // histogram, seconds from arrival at the engine to its first token
	FieldInterToken      Field = "inter_token"            // histogram, seconds between two output tokens
	FieldPrefillPrealloc Field = "prefill_prealloc_queue" // gauge, summed
	FieldDecodePrealloc  Field = "decode_prealloc_queue"  // gauge, summed
	FieldCacheInfo       Field = "cache_info"             // info gauge carrying block size / block count labels
	FieldBlockSize       Field = "block_size"             // gauge alternative to the cache_info label
	FieldNumBlocks       Field = "num_blocks"             // gauge alternative to the cache_info label
)

var allFields = []Field{FieldRunning, FieldWaiting, FieldKVUsage, FieldGenThroughput, FieldGenTokens, FieldPromptTokens,
	FieldPrefillTime, FieldQueueTime, FieldTTFT, FieldInterToken, FieldPrefillPrealloc, FieldDecodePrealloc, FieldCacheInfo, FieldBlockSize, FieldNumBlocks}

// Dialect says where an engine serves its metrics and which names carry each signal.
// In overrides (ScrapeOptions.Dialects), empty fields keep the built-in value.
type Dialect struct {
	// Path of the Prometheus endpoint ("/metrics"; trtllm-serve: "/prometheus/metrics").
	Path string
	// Port of the Prometheus endpoint; 0 means the endpoint's serving port.
	Port int32
	// Names maps each signal to a spec (see AnnotationMetricsNames for the syntax).
	Names map[Field]string
	// BlockSizeLabel and NumBlocksLabel name the labels of the cache_info metric.
	BlockSizeLabel string
	NumBlocksLabel string
}

// Built-in dialects. Sources of the names:
//   - vLLM V1: vllm-project/vllm tests/entrypoints/openai/test_metrics.py (EXPECTED_METRICS_V1) and
//     docs/usage/metrics.md; V0 names (gpu_cache_usage_perc, avg_generation_throughput_toks_per_s)
//     from vllm/engine/metrics.py before V1, still read by the seed's policies.
//   - SGLang: sgl-project/sglang python/sglang/srt/metrics/collector.py; page_size/num_pages gauges
//     in newer builds, cache_config_info{page_size,num_pages} in older ones; queue_time_seconds
//     and inter_token_latency_seconds in newer builds (time_per_output_token_seconds in older).
//   - TensorRT-LLM: NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py (the request
//     histograms need return_perf_metrics); served at /prometheus/metrics by
//     tensorrt_llm/serve/openai_server.py (/metrics there is JSON).
var builtinDialects = map[string]Dialect{
	pool.EngineVLLM: {
		Path: "/metrics",
		Names: map[Field]string{
			FieldRunning:       "vllm:num_requests_running",
			FieldWaiting:       "vllm:num_requests_waiting",
			FieldKVUsage:       "vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc",
			FieldGenThroughput: "vllm:avg_generation_throughput_toks_per_s",
			FieldGenTokens:     "vllm:generation_tokens_total|vllm:generation_tokens",
			FieldPromptTokens:  "vllm:prompt_tokens_total|vllm:prompt_tokens",
			FieldPrefillTime:   "vllm:request_prefill_time_seconds",
			FieldQueueTime:     "vllm:request_queue_time_seconds",
			FieldTTFT:          "vllm:time_to_first_token_seconds",
			FieldInterToken:    "vllm:inter_token_latency_seconds",
			FieldCacheInfo:     "vllm:cache_config_info",
		},
		BlockSizeLabel: "block_size",
		NumBlocksLabel: "num_gpu_blocks",
	},
	pool.EngineSGLang: {
		Path: "/metrics",
		Names: map[Field]string{
			FieldRunning:         "sglang:num_running_reqs",
			FieldWaiting:         "sglang:num_queue_reqs",
			FieldKVUsage:         "sglang:token_usage",
			FieldGenThroughput:   "sglang:gen_throughput",
			FieldGenTokens:       "sglang:generation_tokens_total|sglang:generation_tokens",
			FieldPromptTokens:    "sglang:prompt_tokens_total|sglang:prompt_tokens",
			FieldPrefillPrealloc: "sglang:num_prefill_prealloc_queue_reqs",
			FieldDecodePrealloc:  "sglang:num_decode_prealloc_queue_reqs",
			FieldQueueTime:       "sglang:queue_time_seconds",
			FieldTTFT:            "sglang:time_to_first_token_seconds",
			FieldInterToken:      "sglang:inter_token_latency_seconds|sglang:time_per_output_token_seconds",
			FieldCacheInfo:       "sglang:cache_config_info",
			FieldBlockSize:       "sglang:page_size",
			FieldNumBlocks:       "sglang:num_pages",
		},
		BlockSizeLabel: "page_size",
		NumBlocksLabel: "num_pages",
	},
	pool.EngineTRTLLM: {
		Path: "/prometheus/metrics",
		Names: map[Field]string{
			FieldRunning:      "trtllm_num_requests_running",
			FieldWaiting:      "trtllm_num_requests_waiting",
			FieldKVUsage:      "trtllm_kv_cache_utilization",
			FieldGenTokens:    "trtllm_generation_tokens_total|trtllm_generation_tokens",
			FieldPromptTokens: "trtllm_prompt_tokens_total|trtllm_prompt_tokens",
			FieldPrefillTime:  "trtllm_request_prefill_time_seconds",
			FieldQueueTime:    "trtllm_request_queue_time_seconds",
			FieldTTFT:         "trtllm_time_to_first_token_seconds",
			FieldInterToken:   "trtllm_time_per_output_token_seconds",
			FieldBlockSize:    "trtllm_kv_cache_tokens_per_block",
			FieldNumBlocks:    "trtllm_kv_cache_max_blocks",
		},
	},
}

// Selector picks series of one metric family, optionally only those carrying given labels.
type Selector struct {
	Name   string
	Labels map[string]string
}

// mapping is a resolved dialect: selectors per field, ready for extraction.
type mapping struct {
	path           string
	port           int32
	sel            map[Field][]Selector
	blockSizeLabel string
	numBlocksLabel string
}

// families lists every metric family name the mapping reads, for pre-filtering.
func (m *mapping) families() []string {
	var out []string
	for _, sels := range m.sel {
		for _, s := range sels {
			out = append(out, s.Name)
		}
	}
	sort.Strings(out)
	return out
}

// resolveDialect merges an override over a base dialect and parses the name specs.
// what names the source in errors ("ScrapeOptions.Dialects[vllm]", "annotation tandem.ai/metrics-names").
func resolveDialect(base *mapping, over Dialect, what string) (*mapping, error) {
	m := &mapping{path: base.path, port: base.port, sel: make(map[Field][]Selector, len(allFields)),
		blockSizeLabel: base.blockSizeLabel, numBlocksLabel: base.numBlocksLabel}
	for f, s := range base.sel {
		m.sel[f] = s
	}
	if over.Path != "" {
		if !strings.HasPrefix(over.Path, "/") {
			return nil, fmt.Errorf("%s: path %q must start with \"/\"", what, over.Path)
		}
		m.path = over.Path
	}
	if over.Port != 0 {
		if over.Port < 1 || over.Port > 65535 {
			return nil, fmt.Errorf("%s: port %d must be between 1 and 65535", what, over.Port)
		}
		m.port = over.Port
	}
	if over.BlockSizeLabel != "" {
		m.blockSizeLabel = over.BlockSizeLabel
	}
	if over.NumBlocksLabel != "" {
		m.numBlocksLabel = over.NumBlocksLabel
	}
	for f, spec := range over.Names {
		if !validField(f) {
			return nil, fmt.Errorf("%s: unknown field %q; use one of %s", what, f, fieldList())
		}
		if strings.TrimSpace(spec) == "" { // an explicit empty spec switches the signal off
			delete(m.sel, f)
			continue
		}
		sels, err := ParseSelectors(spec)
		if err != nil {
			return nil, fmt.Errorf("%s: field %q: %w", what, f, err)
		}
		m.sel[f] = sels
	}
	return m, nil
}

// podOverride reads the per-pod annotations into a Dialect; ok is false when there are none.
func podOverride(ann map[string]string) (d Dialect, ok bool, err error) {
	if p, has := ann[AnnotationMetricsPath]; has {
		ok = true
		d.Path = strings.TrimSpace(p)
		if d.Path == "" || !strings.HasPrefix(d.Path, "/") {
			return d, ok, fmt.Errorf("annotation %s=%q: must be a path starting with \"/\", e.g. /metrics", AnnotationMetricsPath, p)
		}
	}
	if p, has := ann[AnnotationMetricsPort]; has {
		ok = true
		n, perr := strconv.Atoi(strings.TrimSpace(p))
		if perr != nil || n < 1 || n > 65535 {
			return d, ok, fmt.Errorf("annotation %s=%q: must be a port number between 1 and 65535", AnnotationMetricsPort, p)
		}
		d.Port = int32(n)
	}
	if spec, has := ann[AnnotationMetricsNames]; has {
		ok = true
		d.Names = map[Field]string{}
		for _, pair := range strings.Split(spec, ";") {
			pair = strings.TrimSpace(pair)
			if pair == "" {
				continue
			}
			k, v, found := strings.Cut(pair, "=")
			if !found {
				return d, ok, fmt.Errorf("annotation %s: %q is not field=metric; write e.g. \"waiting=my_queue_len\"", AnnotationMetricsNames, pair)
			}
			d.Names[Field(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
	}
	return d, ok, nil
}

func validField(f Field) bool {
	for _, g := range allFields {
		if f == g {
			return true
		}
	}
	return false
}

func fieldList() string {
	s := make([]string, len(allFields))
	for i, f := range allFields {
		s[i] = string(f)
	}
	return strings.Join(s, ", ")
}

// ParseSelectors parses `name`, `name{label="value",other=value}` and alternatives joined by "|".
func ParseSelectors(spec string) ([]Selector, error) {
	var out []Selector
	for _, alt := range splitOutsideBraces(spec, '|') {
		alt = strings.TrimSpace(alt)
		sel := Selector{Name: alt}
		if i := strings.IndexByte(alt, '{'); i >= 0 {
			if !strings.HasSuffix(alt, "}") {
				return nil, fmt.Errorf("selector %q: missing closing \"}\"", alt)
			}
			sel.Name = strings.TrimSpace(alt[:i])
			sel.Labels = map[string]string{}
			for _, kv := range strings.Split(alt[i+1:len(alt)-1], ",") {
				kv = strings.TrimSpace(kv)
				if kv == "" {
					continue
				}
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, fmt.Errorf("selector %q: label matcher %q must be label=\"value\"", alt, kv)
				}
				sel.Labels[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"`)
			}
		}
		if !validMetricName(sel.Name) {
			return nil, fmt.Errorf("selector %q: %q is not a Prometheus metric name", alt, sel.Name)
		}
		out = append(out, sel)
	}
	return out, nil
}

func splitOutsideBraces(s string, sep byte) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{':
			depth++
		case '}':
			depth--
		case sep:
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

func validMetricName(n string) bool {
	if n == "" {
		return false
	}
	for i, c := range n {
		ok := c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return false
		}
	}
	return true
}
