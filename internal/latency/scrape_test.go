package latency

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// enginePage is an engine's metrics page (a fixture of internal/metrics) with its queue-time
// histogram and waiting gauge changed, served over HTTP to the real scraper.
type enginePage struct {
	mu   sync.Mutex
	text string
	// batch is held across a set of edits that must be served together (scrapedEngine.at).
	batch sync.Mutex
}

// series sets the first series of family name to set(value) and, when zeroRest, the others
// to 0; the page's layout, labels and other families stay as the engine wrote them.
func (p *enginePage) series(t *testing.T, name string, zeroRest bool, set func(float64) float64) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	lines := strings.Split(p.text, "\n")
	found := false
	for i, l := range lines {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		sp := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		switch {
		case !found:
			v = set(v)
		case zeroRest:
			v = 0
		default:
			continue
		}
		found = true
		lines[i] = l[:sp+1] + strconv.FormatFloat(v, 'g', -1, 64)
	}
	if !found {
		t.Fatalf("the page has no series %s", name)
	}
	p.text = strings.Join(lines, "\n")
}

// sampleTap keeps the samples the scraper publishes (a metrics.Observer).
type sampleTap struct{ ch chan *metrics.Sample }

func (s sampleTap) ScrapeDone(*pool.Endpoint, time.Duration, string) {}
func (s sampleTap) EndpointSample(_ *pool.Endpoint, smp *metrics.Sample) {
	select {
	case s.ch <- smp:
	default: // the test reads only the samples it waits for
	}
}
func (s sampleTap) EndpointStale(*pool.Endpoint, bool)        {}
func (s sampleTap) EndpointGone(*pool.Endpoint)               {}
func (s sampleTap) ConfigError(*pool.Endpoint, string, error) {}
func (s sampleTap) PoolChanged(*pool.Snapshot)                {}

// scrapedEngine runs the real scraper against a real HTTP server serving page, scraping
// every few milliseconds; next waits for the first sample stamped at and accepted by ok.
type scrapedEngine struct {
	page *enginePage
	tap  sampleTap
	mu   sync.Mutex
	now  time.Time
}

// history edits the page before the first scrape: what the engine did before Tandem started.
func startScrapedEngine(t *testing.T, engine, fixture, path string, history func(*enginePage)) *scrapedEngine {
	t.Helper()
	raw, err := os.ReadFile("../metrics/testdata/" + fixture)
	if err != nil {
		t.Fatal(err)
	}
	e := &scrapedEngine{page: &enginePage{text: string(raw)}, tap: sampleTap{ch: make(chan *metrics.Sample, 64)}, now: t0}
	if history != nil {
		history(e.page)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		e.page.batch.Lock()
		e.page.mu.Lock()
		text := e.page.text
		e.page.mu.Unlock()
		e.page.batch.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		fmt.Fprint(w, text)
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	ps := pool.NewStore()
	ps.Publish(pool.Info{}, []*pool.Endpoint{pool.NewEndpoint("ns", "p", "127.0.0.1", int32(p), 0, map[string]string{pool.LabelEngine: engine}, nil)}, true)
	// Scrapes every few milliseconds, each allowed seconds (the default timeout, the interval,
	// would fail scrapes of a loaded machine and leave the endpoint to the suspects' pace).
	sc, err := metrics.NewScraper(ps, metrics.NewStore(), metrics.ScrapeOptions{Interval: 5 * time.Millisecond, Timeout: 5 * time.Second, Observer: e.tap,
		Now: func() time.Time { e.mu.Lock(); defer e.mu.Unlock(); return e.now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// at makes the scrapes from now on stamped at, and lets change rewrite the page, as one
// step: a scrape is stamped after it read the page, so the clock is held until the page is
// whole again (a scrape reading the old page is stamped at too, and the next one then
// differences the whole change against it), and the page's edits are served together.
func (e *scrapedEngine) at(at time.Time, change func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.now = at
	if change != nil {
		e.page.batch.Lock() // the server serves no page while change edits it
		defer e.page.batch.Unlock()
		change()
	}
}

func (e *scrapedEngine) next(t *testing.T, at time.Time, ok func(*metrics.Sample) bool) *metrics.Sample {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case s := <-e.tap.ch:
			if s.UpdatedAt.Equal(at) && ok(s) {
				return s
			}
		case <-deadline:
			t.Fatalf("no sample at %v", at)
		}
	}
}

// The three engines' pages, parsed by the real scraper: a pod whose queue holds work Tandem
// did not route (another replica's, with no shared store) gets the engine's mean queue time
// over the interval as its predicted wait, though its waiting gauge reads 0 at the scrape;
// when the interval's requests were all Tandem's, the histogram adds nothing to the ledger.
func TestScrapedQueueHistogramPredictsTheWait(t *testing.T) {
	for _, c := range []struct {
		engine, fixture, path, queue, waiting string
	}{
		{pool.EngineVLLM, "vllm_v1.prom", "/metrics", "vllm:request_queue_time_seconds", "vllm:num_requests_waiting"},
		{pool.EngineSGLang, "sglang_pd_decode.prom", "/metrics", "sglang:queue_time_seconds", "sglang:num_queue_reqs"},
		{pool.EngineTRTLLM, "trtllm_1_1.prom", "/prometheus/metrics", "trtllm_request_queue_time_seconds", "trtllm_num_requests_waiting"},
	} {
		t.Run(c.engine, func(t *testing.T) {
			// The engine ran long before Tandem started, once overloaded: 100000 requests that
			// waited 5 s on average over its life. The first scrape reads that page.
			e := startScrapedEngine(t, c.engine, c.fixture, c.path, func(p *enginePage) {
				p.series(t, c.waiting, true, func(float64) float64 { return 0 })
				p.series(t, c.queue+"_sum", false, func(v float64) float64 { return v + 5e5 })
				p.series(t, c.queue+"_count", false, func(v float64) float64 { return v + 1e5 })
			})
			const key = "ns/p:1"
			first := e.next(t, t0, func(s *metrics.Sample) bool { return s.HasQueueTimeMean })
			// interval adds n requests that waited wait seconds each to the histogram.
			interval := func(at time.Time, n, wait float64) *metrics.Sample {
				e.at(at, func() {
					e.page.series(t, c.queue+"_sum", false, func(v float64) float64 { return v + n*wait })
					e.page.series(t, c.queue+"_count", false, func(v float64) float64 { return v + n })
				})
				return e.next(t, at, func(s *metrics.Sample) bool { return s.QueueCount == n })
			}

			// The first scrape's means are the engine's lifetime's: no wait comes of them.
			r := newRig(Options{})
			r.m.Ingest(key, first)
			if f := r.m.Forecast(key); !first.HistogramsLifetime || f.Wait() != 0 {
				t.Errorf("first scrape (lifetime mean %.2f s, lifetime flag %v): predicted wait %.4f s, want 0", first.QueueTimeMean, first.HistogramsLifetime, f.Wait())
			}

			// Others' work: ten requests that waited 0.8 s each; Tandem routed none of them.
			at1 := t0.Add(time.Second)
			s1 := interval(at1, 10, 0.8)
			r.clock.Set(at1)
			r.m.Ingest(key, s1)
			if f := r.m.Forecast(key); !near(f.Wait(), 0.8, 0.01) {
				t.Errorf("others' ten requests waited 0.8 s: predicted wait %.4f s, want 0.8 (the waiting gauge read 0)", f.Wait())
			}

			// Tandem's own: the ten requests of the next interval were its prompts, which waited
			// behind each other (0.3 s on average, as its ledger booked them); they all ended.
			r = newRig(Options{})
			r.m.Ingest(key, s1)
			r.clock.Set(at1)
			var trs []*outcome.Tracker
			for range 10 {
				tr := r.rec.Start(outcome.KindWhole, "", key, 1000)
				r.m.Charge(tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: key, Destination: key, Prompt: Prompt{Tokens: 1000}, Service: 0.06})
				trs = append(trs, tr)
			}
			for _, tr := range trs {
				r.clock.Advance(secs(0.06))
				tr.Chunk(1)
				tr.End(nil)
			}
			at2 := t0.Add(2 * time.Second)
			s2 := interval(at2, 10, 0.3)
			r.clock.Set(at2)
			r.m.Ingest(key, s2)
			if f := r.m.Forecast(key); f.Wait() != 0 {
				t.Errorf("the interval's requests were Tandem's own and all ended: predicted wait %.4f s, want the ledger's 0", f.Wait())
			}
		})
	}
}

// A pod that served requests before Tandem first scraped it starts from what its engine
// measured over its life (mean prefill at its mean prompt, mean inter-token gap) rather than
// from the defaults, which are 2–4× off for this engine; a pod Tandem has already learned, or
// an engine with too little history, keeps its model.
func TestNewPodStartsFromItsEngineMetrics(t *testing.T) {
	lifetime := func(at time.Time, prefills float64) *metrics.Sample {
		return &metrics.Sample{
			HistogramsLifetime: true, UpdatedAt: at,
			Running: 8, HasRunning: true,
			PrefillTimeMean: 0.4, PrefillCount: prefills, HasPrefillTimeMean: true,
			PromptTokens: prefills * 4000, HasPromptTokens: true,
			InterTokenMean: 0.04, InterTokenCount: prefills, HasInterTokenMean: true,
		}
	}
	r := newRig(Options{})
	if _, s := r.m.Prefill("ns/new:1", Prompt{Tokens: 4000}); near(s, 0.4, 0.2) {
		t.Fatalf("the defaults already predict %.3f s: the test shows nothing", s)
	}
	r.m.Ingest("ns/new:1", lifetime(r.clock.Now(), 200))
	if _, s := r.m.Prefill("ns/new:1", Prompt{Tokens: 4000}); !near(s, 0.4, 0.01) {
		t.Errorf("new pod: predicted prefill of its engine's mean prompt %.3f s, want the engine's mean 0.4", s)
	}
	if s := r.m.StepSeconds("ns/new:1"); !near(s, 0.04, 0.01) {
		t.Errorf("new pod: predicted step at its 8 running requests %.4f s, want the engine's mean gap 0.04", s)
	}

	// Too little history: the defaults stand.
	def := r.m.Coefficients("ns/other:1")
	r.m.Ingest("ns/young:1", lifetime(r.clock.Now(), 5))
	if c := r.m.Coefficients("ns/young:1"); c.PrefillPerToken != def.PrefillPerToken || c.StepBase != def.StepBase {
		t.Errorf("5 prefills of history moved the model: %+v, defaults %+v", c, def)
	}

	// A pod Tandem learned from keeps what it learned.
	key := "ns/known:1"
	for range 20 {
		p := Prompt{Tokens: 2000}
		tr := r.rec.Start(outcome.KindWhole, "", key, p.Tokens)
		r.m.Charge(tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: key, Destination: key, Prompt: p, Service: 0.1})
		r.clock.Advance(secs(trueService(p, 1)))
		tr.Chunk(1)
		tr.End(nil)
		r.clock.Advance(secs(0.5))
	}
	before := r.m.Coefficients(key)
	r.m.Ingest(key, lifetime(r.clock.Now(), 200))
	if after := r.m.Coefficients(key); after.PrefillPerToken != before.PrefillPerToken {
		t.Errorf("a learned pod was rescaled by its engine's lifetime: %g → %g s/token", before.PrefillPerToken, after.PrefillPerToken)
	}
}
