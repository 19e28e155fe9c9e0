package sim

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// podMetrics serves the pod's metrics in its engine's dialect from a private registry.
// Gauges are read from the scheduler at scrape time; latencies are model seconds.
type podMetrics struct {
	s                       *Server
	reg                     *prometheus.Registry
	promptTokens            atomic.Int64
	cacheQueries, cacheHits atomic.Int64 // in tokens
	prefillTime, ttft       prometheus.Observer
}

// latencyBuckets follow vLLM's TTFT buckets.
var latencyBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}

func newPodMetrics(s *Server) *podMetrics {
	m := &podMetrics{s: s, reg: prometheus.NewRegistry()}
	st := func() Stats { return s.eng.stats() }
	running := func() float64 { return float64(st().Running) }
	waiting := func() float64 { return float64(st().Waiting) }
	kvUsage := func() float64 { x := st(); return float64(x.KVUsedTokens) / float64(x.KVTokens) }
	throughput := func() float64 {
		x := st()
		if x.Running == 0 {
			return 0
		}
		return float64(x.Running) / InterTokenSeconds(s.p, x.Running, x.KVUsedTokens/x.Running)
	}
	model := s.cfg.Model
	blocks := strconv.Itoa(s.p.KVTokens / s.p.BlockSize)
	bs := strconv.Itoa(s.p.BlockSize)
	gauge := func(name, help string, labels prometheus.Labels, f func() float64) {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f))
	}
	counter := func(name, help string, labels prometheus.Labels, v func() int64) {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return float64(v()) }))
	}
	hist := func(name, help string, labels prometheus.Labels) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: latencyBuckets})
		m.reg.MustRegister(h)
		return h
	}
	one := func() float64 { return 1 }
	blockSize := func() float64 { return float64(s.p.BlockSize) }
	numBlocks := func() float64 { return float64(s.p.KVTokens / s.p.BlockSize) }
	gen := func() int64 { return st().Generated }
	switch s.cfg.Engine {
	case EngineVLLM:
		l := prometheus.Labels{"engine": "0", "model_name": model}
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.", l, running)
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", l, waiting)
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", l, kvUsage)
		counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", l, m.promptTokens.Load)
		counter("vllm:generation_tokens_total", "Number of generation tokens processed.", l, gen)
		counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in tokens.", l, m.cacheQueries.Load)
		counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in tokens.", l, m.cacheHits.Load)
		counter("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.", l, func() int64 { return int64(st().Preemptions) })
		m.prefillTime = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", l)
		m.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", l)
		gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.",
			prometheus.Labels{"engine": "0", "block_size": bs, "num_gpu_blocks": blocks, "enable_prefix_caching": "True"}, one)
	case EngineSGLang:
		l := prometheus.Labels{"model_name": model}
		gauge("sglang:num_running_reqs", "The number of running requests.", l, running)
		gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", l, waiting)
		gauge("sglang:token_usage", "The token usage.", l, kvUsage)
		gauge("sglang:gen_throughput", "The generation throughput (token/s).", l, throughput)
		gauge("sglang:num_prefill_prealloc_queue_reqs", "Prefill requests waiting for their decode leg to connect.", l,
			func() float64 { return float64(st().PrefillBootstrap) })
		gauge("sglang:num_decode_prealloc_queue_reqs", "Decode requests waiting for their KV.", l,
			func() float64 { return float64(st().DecodePrealloc) })
		gauge("sglang:cache_config_info", "Cache configuration.", prometheus.Labels{"model_name": model, "page_size": bs, "num_pages": blocks}, one)
		gauge("sglang:page_size", "Tokens per KV page.", l, blockSize)
		gauge("sglang:num_pages", "KV pages.", l, numBlocks)
		counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", l, m.promptTokens.Load)
		counter("sglang:generation_tokens_total", "Number of generation tokens processed.", l, gen)
		m.prefillTime = prometheus.ObserverFunc(func(float64) {})
		m.ttft = hist("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", l)
	case EngineTRTLLM:
		l := prometheus.Labels{"model_name": model, "engine_type": "trtllm"}
		gauge("trtllm_num_requests_running", "Number of requests running.", l, running)
		gauge("trtllm_num_requests_waiting", "Number of requests waiting.", l, waiting)
		gauge("trtllm_kv_cache_utilization", "KV cache utilization (0-1).", l, kvUsage)
		gauge("trtllm_kv_cache_tokens_per_block", "Tokens per KV cache block.", l, blockSize)
		gauge("trtllm_kv_cache_max_blocks", "Maximum KV cache blocks.", l, numBlocks)
		counter("trtllm_prompt_tokens_total", "Number of prompt tokens processed.", l, m.promptTokens.Load)
		counter("trtllm_generation_tokens_total", "Number of generation tokens processed.", l, gen)
		m.prefillTime = prometheus.ObserverFunc(func(float64) {})
		m.ttft = hist("trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.", l)
	}
	return m
}

// MetricsPath is where the pod serves Prometheus text: /prometheus/metrics for TensorRT-LLM
// (its /metrics is JSON iteration stats), /metrics otherwise.
func (s *Server) MetricsPath() string {
	if s.cfg.Engine == EngineTRTLLM {
		return "/prometheus/metrics"
	}
	return "/metrics"
}

func (m *podMetrics) mount(mux *http.ServeMux) {
	h := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	mux.Handle("GET "+m.s.MetricsPath(), h)
	if m.s.cfg.Engine == EngineTRTLLM {
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
			st := m.s.eng.stats()
			b, _ := json.Marshal([]any{map[string]any{
				"numActiveRequests": st.Running, "numQueuedRequests": st.Waiting,
				"kvCacheStats": map[string]any{"usedNumBlocks": st.KVUsedTokens / m.s.p.BlockSize, "maxNumBlocks": st.KVTokens / m.s.p.BlockSize, "tokensPerBlock": m.s.p.BlockSize},
			}})
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(b)
		})
	}
}
