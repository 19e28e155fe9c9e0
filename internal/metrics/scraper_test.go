package metrics

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/testnet"
)

// engineServer is a real HTTP server on 127.0.0.1 whose metrics page and status a test changes.
type engineServer struct {
	*httptest.Server
	mu     sync.Mutex
	path   string
	page   string
	status int
	hits   atomic.Int64
}

func newEngineServer(t *testing.T, path, page string) *engineServer {
	e := &engineServer{path: path, page: page, status: http.StatusOK}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.hits.Add(1)
		e.mu.Lock()
		path, page, status := e.path, e.page, e.status
		e.mu.Unlock()
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.WriteHeader(status)
		fmt.Fprint(w, page)
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *engineServer) set(status int, page string) {
	e.mu.Lock()
	e.status, e.page = status, page
	e.mu.Unlock()
}

func (e *engineServer) port(t *testing.T) int32 {
	_, p, err := net.SplitHostPort(e.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return int32(n)
}

// recorder is an Observer that keeps every event and wakes waiters on each one.
type recorder struct {
	mu      sync.Mutex
	samples map[string][]*Sample
	stale   map[string][]bool
	classes map[string][]string
	gone    map[string]bool
	cfgErrs map[string][]error
	wake    chan struct{}
}

func newRecorder() *recorder {
	return &recorder{samples: map[string][]*Sample{}, stale: map[string][]bool{}, classes: map[string][]string{},
		gone: map[string]bool{}, cfgErrs: map[string][]error{}, wake: make(chan struct{}, 1)}
}

func (r *recorder) notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *recorder) ScrapeDone(ep *pool.Endpoint, _ time.Duration, class string) {
	r.mu.Lock()
	r.classes[ep.Key()] = append(r.classes[ep.Key()], class)
	r.mu.Unlock()
	r.notify()
}
func (r *recorder) EndpointSample(ep *pool.Endpoint, s *Sample) {
	r.mu.Lock()
	r.samples[ep.Key()] = append(r.samples[ep.Key()], s)
	r.mu.Unlock()
	r.notify()
}
func (r *recorder) EndpointStale(ep *pool.Endpoint, stale bool) {
	r.mu.Lock()
	r.stale[ep.Key()] = append(r.stale[ep.Key()], stale)
	r.mu.Unlock()
	r.notify()
}
func (r *recorder) EndpointGone(ep *pool.Endpoint) {
	r.mu.Lock()
	r.gone[ep.Key()] = true
	r.mu.Unlock()
	r.notify()
}
func (r *recorder) ConfigError(ep *pool.Endpoint, _ string, err error) {
	r.mu.Lock()
	r.cfgErrs[ep.Key()] = append(r.cfgErrs[ep.Key()], err)
	r.mu.Unlock()
	r.notify()
}
func (r *recorder) PoolChanged(*pool.Snapshot) {}

// waitFor blocks until cond (called under the lock) holds, or fails the test after 10 s.
func (r *recorder) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.wake:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// vllmPage is a minimal vLLM V1 page with the given running count and generation-token counter.
func vllmPage(running, genTokens float64) string {
	return fmt.Sprintf(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %g
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} %g
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1
`, running, genTokens)
}

func endpoint(ns, name string, port int32, labels, ann map[string]string) *pool.Endpoint {
	return pool.NewEndpoint(ns, name, "127.0.0.1", port, 0, labels, ann)
}

func startScraper(t *testing.T, ps *pool.Store, samples *Store, opts ScrapeOptions) {
	t.Helper()
	s, err := NewScraper(ps, samples, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
}

// TestScraperLifecycle runs the scraper against a real server that changes its page: values,
// counter-derived throughput, staleness after failures, recovery, and removal from the pool.
func TestScraperLifecycle(t *testing.T) {
	srv := newEngineServer(t, "/metrics", vllmPage(2, 1000))
	ps, samples, rec := pool.NewStore(), NewStore(), newRecorder()
	ep := endpoint("ns", "decode-0", srv.port(t), map[string]string{pool.LabelEngine: "vllm"}, nil)
	ps.Publish(pool.Info{}, []*pool.Endpoint{ep}, true)
	const staleAfter = 300 * time.Millisecond
	startScraper(t, ps, samples, ScrapeOptions{Interval: 20 * time.Millisecond, StaleAfter: staleAfter, Observer: rec})
	key := ep.Key()

	// 1. First scrape: gauges read, no throughput yet (one counter value is not a rate).
	rec.waitFor(t, "first sample", func() bool { return len(rec.samples[key]) >= 1 })
	first := samples.Get(key)
	assertSample(t, first, &Sample{Running: 2, HasRunning: true, Waiting: 1, HasWaiting: true, KVUsage: 0.5, HasKVUsage: true,
		BlockSize: 16, NumGPUBlocks: 1000})

	// 2. The engine generates 600 tokens: the next sample derives tokens/s from the counter.
	srv.set(http.StatusOK, vllmPage(5, 1600))
	var prev, cur *Sample
	rec.waitFor(t, "sample of the new page", func() bool {
		ss := rec.samples[key]
		for i := 1; i < len(ss); i++ {
			if ss[i].Running == 5 {
				prev, cur = ss[i-1], ss[i]
				return true
			}
		}
		return false
	})
	wantTput := 600 / cur.UpdatedAt.Sub(prev.UpdatedAt).Seconds()
	if !cur.HasGenThroughput || math.Abs(cur.GenThroughput-wantTput) > 1e-6 {
		t.Errorf("throughput = %v (has %v), want 600 tokens / %v = %v", cur.GenThroughput, cur.HasGenThroughput,
			cur.UpdatedAt.Sub(prev.UpdatedAt), wantTput)
	}

	// 3. The pod stops answering: after StaleAfter its sample goes stale with every reading missing.
	srv.set(http.StatusInternalServerError, "")
	rec.waitFor(t, "stale", func() bool { st := rec.stale[key]; return len(st) > 0 && st[len(st)-1] })
	st := samples.Get(key)
	if !st.Stale || st.HasRunning || st.HasWaiting || st.HasKVUsage || st.HasGenThroughput || st.HasPrefillTimeMean || st.HasPreallocQueues {
		t.Errorf("stale sample = %+v, want Stale and no Has* flag", st)
	}
	rec.mu.Lock()
	lastGood := rec.samples[key][len(rec.samples[key])-1].UpdatedAt
	rec.mu.Unlock()
	if !st.UpdatedAt.Equal(lastGood) {
		t.Errorf("stale UpdatedAt = %v, want the last good scrape %v", st.UpdatedAt, lastGood)
	}
	if since := time.Since(lastGood); since < staleAfter {
		t.Errorf("went stale %v after the last good scrape, before StaleAfter %v", since, staleAfter)
	}
	rec.mu.Lock()
	hasHTTPStatus := false
	for _, c := range rec.classes[key] {
		hasHTTPStatus = hasHTTPStatus || c == ErrClassHTTPStatus
	}
	rec.mu.Unlock()
	if !hasHTTPStatus {
		t.Error("no scrape was reported with class http_status")
	}

	// 4. It answers again: the next good scrape recovers it by itself.
	srv.set(http.StatusOK, vllmPage(7, 2000))
	rec.waitFor(t, "recovery", func() bool { st := rec.stale[key]; return !st[len(st)-1] })
	got := samples.Get(key)
	if got.Stale || !got.HasRunning || got.Running != 7 {
		t.Errorf("after recovery sample = %+v, want fresh with Running 7", got)
	}

	// 5. The pod leaves the pool: its sample is deleted and the observer told.
	ps.Publish(pool.Info{}, nil, true)
	rec.waitFor(t, "endpoint gone", func() bool { return rec.gone[key] })
	if samples.Get(key) != nil {
		t.Error("sample of a removed endpoint is still in the store")
	}
}

// TestScraperDialects scrapes three engines and a pod with annotation overrides side by side.
func TestScraperDialects(t *testing.T) {
	vllm := newEngineServer(t, "/metrics", vllmPage(3, 10))
	trt := newEngineServer(t, "/prometheus/metrics", "# TYPE trtllm_num_requests_running gauge\ntrtllm_num_requests_running{engine_type=\"trtllm\",model_name=\"m\"} 9\n")
	sgl := newEngineServer(t, "/metrics", "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 4\n")
	custom := newEngineServer(t, "/stats/prom", "# TYPE my_running gauge\nmy_running 11\n")
	// The pod serves on one port and its metrics on another (the custom server).
	servePort := vllm.port(t)
	eps := []*pool.Endpoint{
		endpoint("ns", "v", vllm.port(t), map[string]string{pool.LabelEngine: "vllm"}, nil),
		endpoint("ns", "t", trt.port(t), map[string]string{pool.LabelEngine: "trtllm"}, nil),
		endpoint("ns", "s", sgl.port(t), map[string]string{pool.LabelEngine: "sglang"}, nil),
		pool.NewEndpoint("ns", "c", "127.0.0.1", servePort, 0, map[string]string{pool.LabelEngine: "vllm"}, map[string]string{
			AnnotationMetricsPath:  "/stats/prom",
			AnnotationMetricsPort:  strconv.Itoa(int(custom.port(t))),
			AnnotationMetricsNames: "running=my_running; waiting=",
		}),
	}
	ps, samples, rec := pool.NewStore(), NewStore(), newRecorder()
	ps.Publish(pool.Info{}, eps, true)
	startScraper(t, ps, samples, ScrapeOptions{Interval: 20 * time.Millisecond, Observer: rec})
	rec.waitFor(t, "a sample of every endpoint", func() bool {
		for _, ep := range eps {
			if len(rec.samples[ep.Key()]) == 0 {
				return false
			}
		}
		return true
	})
	want := map[string]Sample{
		"ns/v": {Running: 3, HasRunning: true, Waiting: 1, HasWaiting: true, KVUsage: 0.5, HasKVUsage: true, BlockSize: 16, NumGPUBlocks: 1000},
		"ns/t": {Running: 9, HasRunning: true},
		"ns/s": {Waiting: 4, HasWaiting: true},
		"ns/c": {Running: 11, HasRunning: true},
	}
	for _, ep := range eps {
		w := want[ep.PodKey()]
		assertSample(t, samples.Get(ep.Key()), &w)
	}
}

// TestScraperBounds checks the per-scrape limits: body size, timeout, bad annotations, and the
// worker bound on concurrent scrapes.
func TestScraperBounds(t *testing.T) {
	big := newEngineServer(t, "/metrics", "# TYPE vllm:num_requests_running gauge\n"+strings.Repeat("vllm:num_requests_running{engine=\"0\"} 1\n", 200))

	release := make(chan struct{})
	var inflight, maxInflight atomic.Int64
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		for {
			m := maxInflight.Load()
			if n <= m || maxInflight.CompareAndSwap(m, n) {
				break
			}
		}
		defer inflight.Add(-1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	_, sp, _ := net.SplitHostPort(slow.Listener.Addr().String())
	slowPort, _ := strconv.Atoi(sp)

	eps := []*pool.Endpoint{
		endpoint("ns", "big", big.port(t), nil, nil),
		endpoint("ns", "badann", big.port(t), nil, map[string]string{AnnotationMetricsPort: "http"}),
	}
	for i := range 4 {
		eps = append(eps, endpoint("ns", fmt.Sprintf("slow-%d", i), int32(slowPort), nil, nil))
	}
	ps, samples, rec := pool.NewStore(), NewStore(), newRecorder()
	ps.Publish(pool.Info{}, eps, true)
	startScraper(t, ps, samples, ScrapeOptions{Interval: 20 * time.Millisecond, Timeout: 50 * time.Millisecond,
		MaxBodyBytes: 1024, Workers: 2, Observer: rec})

	has := func(key, class string) bool {
		for _, c := range rec.classes[key] {
			if c == class {
				return true
			}
		}
		return false
	}
	rec.waitFor(t, "too_large and timeout classes", func() bool {
		return has(eps[0].Key(), ErrClassTooLarge) && has(eps[2].Key(), ErrClassTimeout)
	})
	rec.waitFor(t, "config error for tandem.ai/metrics-port", func() bool { return len(rec.cfgErrs[eps[1].Key()]) > 0 })
	rec.mu.Lock()
	msg := rec.cfgErrs[eps[1].Key()][0].Error()
	rec.mu.Unlock()
	if !strings.Contains(msg, AnnotationMetricsPort) || !strings.Contains(msg, "between 1 and 65535") {
		t.Errorf("config error %q does not name the annotation and the rule", msg)
	}
	// Workers=2 for answering endpoints plus max(2/4, 2) for failing ones.
	if m := maxInflight.Load(); m > 4 {
		t.Errorf("%d scrapes in flight at once, want at most 4 (Workers=2 + 2 suspect workers)", m)
	}
	if samples.Get(eps[0].Key()) != nil {
		t.Error("an over-size page produced a sample")
	}
}

// TestHangingPodsDoNotStarve checks that pods hanging until the timeout, more of them than
// there are workers, do not hold up the scrapes of a pod that answers.
func TestHangingPodsDoNotStarve(t *testing.T) {
	healthy := newEngineServer(t, "/metrics", vllmPage(1, 1))
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(release) })
	_, hp, _ := net.SplitHostPort(hang.Listener.Addr().String())
	hangPort, _ := strconv.Atoi(hp)

	ok := endpoint("ns", "healthy", healthy.port(t), nil, nil)
	eps := []*pool.Endpoint{ok}
	for i := range 6 {
		eps = append(eps, endpoint("ns", fmt.Sprintf("hang-%d", i), int32(hangPort), nil, nil))
	}
	ps, samples, rec := pool.NewStore(), NewStore(), newRecorder()
	ps.Publish(pool.Info{}, eps, true)
	const timeout = 200 * time.Millisecond
	startScraper(t, ps, samples, ScrapeOptions{Interval: 20 * time.Millisecond, Timeout: timeout,
		StaleAfter: 5 * time.Second, Workers: 2, Observer: rec})

	timeouts := func(n int) func() bool {
		return func() bool {
			for _, e := range eps[1:] {
				c := 0
				for _, cl := range rec.classes[e.Key()] {
					if cl == ErrClassTimeout {
						c++
					}
				}
				if c < n {
					return false
				}
			}
			return true
		}
	}
	// Once every hanging pod has failed once, they are scraped by the suspect workers only.
	rec.waitFor(t, "a timeout from every hanging pod", timeouts(1))
	rec.mu.Lock()
	before := len(rec.samples[ok.Key()])
	rec.mu.Unlock()
	rec.waitFor(t, "a second timeout from every hanging pod", timeouts(2))
	rec.mu.Lock()
	gained := len(rec.samples[ok.Key()]) - before
	rec.mu.Unlock()
	// A round of hanging scrapes (6 pods, 2 suspect workers, 200 ms each) takes ≥ 600 ms: the
	// healthy pod, scraped every 20 ms, gets ~30 samples meanwhile; with shared workers, ~2.
	if gained < 5 {
		t.Errorf("the answering pod got %d samples while the hanging pods timed out once more, want ≥ 5", gained)
	}
}

func TestOptionErrors(t *testing.T) {
	cases := []struct {
		name string
		opts ScrapeOptions
		want string
	}{
		{"stale before interval", ScrapeOptions{Interval: time.Second, StaleAfter: time.Second}, "StaleAfter"},
		{"negative workers", ScrapeOptions{Workers: -1}, "Workers"},
		{"bad scheme", ScrapeOptions{Scheme: "ftp"}, "Scheme"},
		{"unknown field", ScrapeOptions{Dialects: map[string]Dialect{"vllm": {Names: map[Field]string{"runing": "x"}}}}, `unknown field "runing"`},
		{"bad path", ScrapeOptions{Dialects: map[string]Dialect{"vllm": {Path: "metrics"}}}, "must start with"},
		{"bad selector", ScrapeOptions{Dialects: map[string]Dialect{"sglang": {Names: map[Field]string{FieldRunning: "a b"}}}}, "Dialects[sglang]"},
	}
	for _, c := range cases {
		_, err := NewScraper(pool.NewStore(), NewStore(), c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to mention %q", c.name, err, c.want)
		}
	}
}

func TestIntervalFromEnv(t *testing.T) {
	cases := []struct {
		val     string
		want    time.Duration
		wantErr bool
	}{
		{"", DefaultInterval, false},
		{"50", 50 * time.Millisecond, false},
		{"2000", 2 * time.Second, false},
		{"0", 0, true},
		{"-5", 0, true},
		{"1s", 0, true},
	}
	for _, c := range cases {
		got, err := IntervalFromEnv(func(k string) string {
			if k == EnvRefreshInterval {
				return c.val
			}
			return ""
		})
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("%q: got %v, %v; want %v (err %v)", c.val, got, err, c.want, c.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), EnvRefreshInterval) {
			t.Errorf("%q: error %q does not name the setting", c.val, err)
		}
	}
}

// probeRecorder also takes every scrape as a probe (ProbeObserver).
type probeRecorder struct {
	*recorder
	probes map[string][]string // key -> "class serving=bool"
}

func (r *probeRecorder) ScrapeProbed(ep *pool.Endpoint, serving bool, _ time.Duration, class string, err error) {
	r.mu.Lock()
	if (class == "") != (err == nil) {
		class = "mismatch"
	}
	r.probes[ep.Key()] = append(r.probes[ep.Key()], fmt.Sprintf("%s serving=%v", class, serving))
	r.mu.Unlock()
	r.notify()
}

// Every scrape is a probe of its endpoint for passive health: a closed serving port is
// "refused" (nothing listens where requests go), a closed metrics port is refused on another
// port, and a good scrape is a success.
func TestScrapesAreProbes(t *testing.T) {
	srv := newEngineServer(t, "/metrics", vllmPage(1, 10))
	closed := testnet.RefusedPort(t)
	p := strconv.Itoa(closed)
	good := endpoint("ns", "good", srv.port(t), nil, nil)
	dead := endpoint("ns", "dead", int32(closed), nil, nil)
	metricsGone := endpoint("ns", "metrics-gone", srv.port(t), nil, map[string]string{AnnotationMetricsPort: p})
	ps := pool.NewStore()
	ps.Publish(pool.Info{}, []*pool.Endpoint{good, dead, metricsGone}, true)
	rec := &probeRecorder{recorder: newRecorder(), probes: map[string][]string{}}
	startScraper(t, ps, NewStore(), ScrapeOptions{Interval: 50 * time.Millisecond, Observer: rec})
	rec.waitFor(t, "a probe of each endpoint", func() bool {
		return len(rec.probes[good.Key()]) > 0 && len(rec.probes[dead.Key()]) > 0 && len(rec.probes[metricsGone.Key()]) > 0
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for key, want := range map[string]string{good.Key(): " serving=true", dead.Key(): "refused serving=true",
		metricsGone.Key(): "refused serving=false"} {
		if got := rec.probes[key][0]; got != want {
			t.Errorf("%s: probe %q, want %q", key, got, want)
		}
	}
}
