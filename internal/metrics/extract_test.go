package metrics

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

// parseFixture parses a testdata page with an engine's built-in dialect.
func parseFixture(t *testing.T, file, contentType, engine string) reading {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := NewScraper(pool.NewStore(), NewStore(), ScrapeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fams, err := decodeFamilies(f, contentType, s.want[engine])
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return extract(fams, s.dialect[engine], time.Unix(1000, 0))
}

const textCT = "text/plain; version=0.0.4; charset=utf-8"

// TestFixtures reads every engine fixture into the numbers written in it (see testdata/README.md).
func TestFixtures(t *testing.T) {
	cases := []struct {
		file, ct, engine string
		want             Sample
	}{
		{"vllm_v1.prom", textCT, pool.EngineVLLM, Sample{
			Running: 4, HasRunning: true, Waiting: 1, HasWaiting: true, KVUsage: 0.42, HasKVUsage: true,
			PrefillTimeMean: 41.25 / 330, HasPrefillTimeMean: true, BlockSize: 16, NumGPUBlocks: 27648,
			QueueTimeMean: 12.5 / 500, HasQueueTimeMean: true, TTFTMean: 98.4 / 500, HasTTFTMean: true,
			InterTokenMean: 1502.0 / 75000, HasInterTokenMean: true}},
		// Two engines behind one server: requests add up, KV usage is the mean (0.30+0.50)/2,
		// blocks add up, the prefill mean is over both histograms (41.25+18.75)/(330+170).
		{"vllm_v1_dp2.prom", textCT, pool.EngineVLLM, Sample{
			Running: 8, HasRunning: true, Waiting: 2, HasWaiting: true, KVUsage: 0.40, HasKVUsage: true,
			PrefillTimeMean: 0.12, HasPrefillTimeMean: true, BlockSize: 16, NumGPUBlocks: 27648,
			QueueTimeMean: 25.0 / 1000, HasQueueTimeMean: true, TTFTMean: 196.8 / 1000, HasTTFTMean: true,
			InterTokenMean: 3004.0 / 150000, HasInterTokenMean: true}},
		// V0: the older KV name and the throughput gauge (no counter derivation needed).
		{"vllm_v0.prom", textCT, pool.EngineVLLM, Sample{
			Running: 7, HasRunning: true, Waiting: 3, HasWaiting: true, KVUsage: 0.8125, HasKVUsage: true,
			GenThroughput: 342.7, HasGenThroughput: true, PrefillTimeMean: 30.0 / 200, HasPrefillTimeMean: true,
			BlockSize: 16, NumGPUBlocks: 2375}},
		{"vllm_v1.openmetrics", "application/openmetrics-text; version=1.0.0; charset=utf-8", pool.EngineVLLM, Sample{
			Running: 4, HasRunning: true, Waiting: 1, HasWaiting: true, KVUsage: 0.42, HasKVUsage: true,
			PrefillTimeMean: 41.25 / 330, HasPrefillTimeMean: true, BlockSize: 16, NumGPUBlocks: 27648}},
		// SGLang 0.4 has no prealloc queues (not a PD server) and block info in cache_config_info.
		{"sglang_v0_4.prom", textCT, pool.EngineSGLang, Sample{
			Running: 162, HasRunning: true, Waiting: 2826, HasWaiting: true, KVUsage: 0.28, HasKVUsage: true,
			GenThroughput: 86.50814177726902, HasGenThroughput: true, BlockSize: 1, NumGPUBlocks: 442368,
			TTFTMean: 2.3518979474117756e+06 / 31110, HasTTFTMean: true}},
		// SGLang PD decode, DP attention with 2 ranks: 40+24 running, 0+1 queued, KV (0.61+0.45)/2,
		// throughput 1200.5+800.25, decode prealloc 3+2; page_size/num_pages gauges; queue time
		// (6+2)/(100+60), inter-token 100/4000.
		{"sglang_pd_decode.prom", textCT, pool.EngineSGLang, Sample{
			Running: 64, HasRunning: true, Waiting: 1, HasWaiting: true, KVUsage: 0.53, HasKVUsage: true,
			GenThroughput: 2000.75, HasGenThroughput: true, DecodePreallocQueue: 5, HasPreallocQueues: true,
			BlockSize: 64, NumGPUBlocks: 9000, QueueTimeMean: 0.05, HasQueueTimeMean: true,
			InterTokenMean: 0.025, HasInterTokenMean: true}},
		{"trtllm_1_1.prom", textCT, pool.EngineTRTLLM, Sample{
			Running: 12, HasRunning: true, Waiting: 4, HasWaiting: true, KVUsage: 0.25, HasKVUsage: true,
			PrefillTimeMean: 13.1 / 262, HasPrefillTimeMean: true, BlockSize: 32, NumGPUBlocks: 4096,
			QueueTimeMean: 0.01, HasQueueTimeMean: true, TTFTMean: 0.15, HasTTFTMean: true,
			InterTokenMean: 0.015, HasInterTokenMean: true}},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			got := toSample(parseFixture(t, c.file, c.ct, c.engine), nil, nil)
			c.want.UpdatedAt = time.Unix(1000, 0)
			assertSample(t, got, &c.want)
		})
	}
}

func assertSample(t *testing.T, got, want *Sample) {
	t.Helper()
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	type f struct {
		name      string
		g, w      float64
		gh, wh    bool
		checkVals bool
	}
	for _, x := range []f{
		{"Running", got.Running, want.Running, got.HasRunning, want.HasRunning, true},
		{"Waiting", got.Waiting, want.Waiting, got.HasWaiting, want.HasWaiting, true},
		{"KVUsage", got.KVUsage, want.KVUsage, got.HasKVUsage, want.HasKVUsage, true},
		{"GenThroughput", got.GenThroughput, want.GenThroughput, got.HasGenThroughput, want.HasGenThroughput, true},
		{"PrefillTimeMean", got.PrefillTimeMean, want.PrefillTimeMean, got.HasPrefillTimeMean, want.HasPrefillTimeMean, true},
		{"QueueTimeMean", got.QueueTimeMean, want.QueueTimeMean, got.HasQueueTimeMean, want.HasQueueTimeMean, true},
		{"TTFTMean", got.TTFTMean, want.TTFTMean, got.HasTTFTMean, want.HasTTFTMean, true},
		{"InterTokenMean", got.InterTokenMean, want.InterTokenMean, got.HasInterTokenMean, want.HasInterTokenMean, true},
		{"PrefillPreallocQueue", got.PrefillPreallocQueue, want.PrefillPreallocQueue, got.HasPreallocQueues, want.HasPreallocQueues, true},
		{"DecodePreallocQueue", got.DecodePreallocQueue, want.DecodePreallocQueue, got.HasPreallocQueues, want.HasPreallocQueues, true},
	} {
		if x.gh != x.wh {
			t.Errorf("Has%s = %v, want %v", x.name, x.gh, x.wh)
		}
		if x.wh && !near(x.g, x.w) {
			t.Errorf("%s = %v, want %v", x.name, x.g, x.w)
		}
	}
	if got.BlockSize != want.BlockSize || got.NumGPUBlocks != want.NumGPUBlocks {
		t.Errorf("blocks = %d×%d, want %d×%d", got.BlockSize, got.NumGPUBlocks, want.BlockSize, want.NumGPUBlocks)
	}
	if got.Stale != want.Stale {
		t.Errorf("Stale = %v, want %v", got.Stale, want.Stale)
	}
	if !want.UpdatedAt.IsZero() && !got.UpdatedAt.Equal(want.UpdatedAt) {
		t.Errorf("UpdatedAt = %v, want %v", got.UpdatedAt, want.UpdatedAt)
	}
}

// TestDerived checks the two-scrape signals: throughput from the generation-token counter and
// the prefill-time mean over the interval.
func TestDerived(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := func(sec float64, tokens, psum, pcount float64) reading {
		rd := reading{at: t0.Add(time.Duration(sec * float64(time.Second))), genTokens: tokens, hasGenTokens: true}
		rd.hists[histPrefill] = histTotals{sum: psum, count: pcount, ok: true}
		return rd
	}
	first := r(0, 1000, 10, 100) // lifetime mean 0.1 s
	s1 := toSample(first, nil, nil)
	cases := []struct {
		name           string
		cur            reading
		wantTput       float64
		wantHasTput    bool
		wantPrefill    float64
		wantHasPrefill bool
		wantCount      float64
	}{
		// 500 tokens in 2 s = 250 tok/s; 4 prefills took 2 s together = 0.5 s each.
		{"steady", r(2, 1500, 12, 104), 250, true, 0.5, true, 4},
		// No new prefill: the last mean stands (none in the interval); no new tokens: 0 tok/s.
		{"idle", r(1, 1000, 10, 100), 0, true, 0.1, true, 0},
		// Counter went back (engine restart): the new value is the increase, like Prometheus' rate();
		// the prefill histogram restarted too, so its lifetime mean is used.
		{"restart", r(4, 200, 1, 4), 50, true, 0.25, true, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := toSample(c.cur, &first, s1)
			if got.HasGenThroughput != c.wantHasTput || math.Abs(got.GenThroughput-c.wantTput) > 1e-9 {
				t.Errorf("throughput = %v (has %v), want %v (has %v)", got.GenThroughput, got.HasGenThroughput, c.wantTput, c.wantHasTput)
			}
			if got.HasPrefillTimeMean != c.wantHasPrefill || math.Abs(got.PrefillTimeMean-c.wantPrefill) > 1e-9 {
				t.Errorf("prefill mean = %v (has %v), want %v", got.PrefillTimeMean, got.HasPrefillTimeMean, c.wantPrefill)
			}
			if got.PrefillCount != c.wantCount {
				t.Errorf("prefills in the interval = %v, want %v", got.PrefillCount, c.wantCount)
			}
		})
	}
	if s1.HasGenThroughput {
		t.Error("first scrape has no previous counter value, so no throughput")
	}
	if !s1.HasPrefillTimeMean || s1.PrefillTimeMean != 0.1 {
		t.Errorf("first scrape prefill mean = %v, want the lifetime mean 0.1", s1.PrefillTimeMean)
	}
}

func TestParseSelectors(t *testing.T) {
	cases := []struct {
		spec    string
		want    []Selector
		wantErr bool
	}{
		{"vllm:num_requests_running", []Selector{{Name: "vllm:num_requests_running"}}, false},
		{"a|b", []Selector{{Name: "a"}, {Name: "b"}}, false},
		{`nv_trt_llm_request_metrics{request_type="waiting"}`, []Selector{{Name: "nv_trt_llm_request_metrics", Labels: map[string]string{"request_type": "waiting"}}}, false},
		{`m{a="x|y",b=z}|n`, []Selector{{Name: "m", Labels: map[string]string{"a": "x|y", "b": "z"}}, {Name: "n"}}, false},
		{"bad-name", nil, true},
		{`m{a}`, nil, true},
		{`m{a="x"`, nil, true},
		{"", nil, true},
	}
	for _, c := range cases {
		got, err := ParseSelectors(c.spec)
		if (err != nil) != c.wantErr {
			t.Errorf("%q: err = %v, wantErr %v", c.spec, err, c.wantErr)
			continue
		}
		if len(got) != len(c.want) {
			t.Errorf("%q: got %v, want %v", c.spec, got, c.want)
			continue
		}
		for i := range got {
			if got[i].Name != c.want[i].Name || len(got[i].Labels) != len(c.want[i].Labels) {
				t.Errorf("%q: got %v, want %v", c.spec, got, c.want)
			}
			for k, v := range c.want[i].Labels {
				if got[i].Labels[k] != v {
					t.Errorf("%q: label %s = %q, want %q", c.spec, k, got[i].Labels[k], v)
				}
			}
		}
	}
}

// TestLabelSelector reads Triton's TRT-LLM layout through a pool-level override, the case the
// `name{label="value"}` syntax exists for.
func TestLabelSelector(t *testing.T) {
	page := `# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="ensemble",request_type="waiting",version="1"} 6
nv_trt_llm_request_metrics{model="ensemble",request_type="scheduled",version="1"} 9
nv_trt_llm_request_metrics{model="ensemble",request_type="max",version="1"} 512
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="ensemble",version="1"} 0.75
`
	s, err := NewScraper(pool.NewStore(), NewStore(), ScrapeOptions{Dialects: map[string]Dialect{"triton": {
		Path: "/metrics", Port: 8002,
		Names: map[Field]string{
			FieldRunning: `nv_trt_llm_request_metrics{request_type="scheduled"}`,
			FieldWaiting: `nv_trt_llm_request_metrics{request_type="waiting"}`,
			FieldKVUsage: `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`,
		}}}})
	if err != nil {
		t.Fatal(err)
	}
	fams, err := decodeFamilies(stringsReader(page), textCT, s.want["triton"])
	if err != nil {
		t.Fatal(err)
	}
	got := toSample(extract(fams, s.dialect["triton"], time.Unix(1, 0)), nil, nil)
	assertSample(t, got, &Sample{Running: 9, HasRunning: true, Waiting: 6, HasWaiting: true, KVUsage: 0.75, HasKVUsage: true})
	if s.dialect["triton"].port != 8002 {
		t.Errorf("port = %d, want 8002", s.dialect["triton"].port)
	}
}

// TestNonFiniteValues checks that NaN and infinite values are missing readings, not numbers.
func TestNonFiniteValues(t *testing.T) {
	page := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} NaN
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} +Inf
vllm:kv_cache_usage_perc{engine="1"} 0.25
`
	s, err := NewScraper(pool.NewStore(), NewStore(), ScrapeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fams, err := decodeFamilies(stringsReader(page), textCT, s.want[pool.EngineVLLM])
	if err != nil {
		t.Fatal(err)
	}
	got := toSample(extract(fams, s.dialect[pool.EngineVLLM], time.Unix(1, 0)), nil, nil)
	// Running has no finite series; KV usage is the mean of the one finite engine.
	assertSample(t, got, &Sample{KVUsage: 0.25, HasKVUsage: true})
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct{ name, body, ct string }{
		{"json from trtllm-serve /metrics", `[{"iter": 1}]`, "application/json"},
		{"broken text", "vllm:num_requests_running{engine=\"0\" 4\n", textCT},
		{"duplicate TYPE", "# TYPE a gauge\na 1\n# TYPE a gauge\na 2\n", textCT},
	}
	for _, c := range cases {
		if _, err := decodeFamilies(stringsReader(c.body), c.ct, map[string]bool{"a": true, "vllm:num_requests_running": true}); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }
