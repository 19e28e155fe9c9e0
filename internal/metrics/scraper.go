package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

// EnvRefreshInterval is the seed's setting for how often engine metrics are scraped.
const EnvRefreshInterval = "AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS"

// Defaults. DefaultInterval is measured, not guessed: bench/metrics scrapes 1024 endpoints
// serving a realistic vLLM V1 page (DP=2, ~90 KiB); at 1 s the scraper uses well under the
// 0.2-core budget (see the numbers in the report and docs/metrics.md). The seed's policies read
// load that changes on the scale of requests (seconds), and the gateway-side trackers (requests
// in flight, token ledgers) cover bursts shorter than the interval.
const (
	DefaultInterval     = time.Second
	DefaultMaxBodyBytes = 4 << 20
	DefaultWorkers      = 64
	// A pod is stale after this many intervals without a good scrape (and at least 2 s, the
	// GIE default), so one lost scrape does not flap the routing.
	defaultStaleIntervals = 3
	minStaleAfter         = 2 * time.Second
)

// ScrapeOptions tunes the Scraper. Zero values take the defaults.
type ScrapeOptions struct {
	// Interval between two scrapes of one endpoint (IntervalFromEnv reads the seed's setting).
	Interval time.Duration
	// Timeout bounds one scrape (connect + response); default min(Interval, 1s).
	Timeout time.Duration
	// StaleAfter is how long an endpoint may fail before its sample goes stale;
	// default max(3 × Interval, 2s). Must exceed Interval.
	StaleAfter time.Duration
	// Workers bounds concurrent scrapes (default 64).
	Workers int
	// MaxBodyBytes bounds one metrics page (default 4 MiB).
	MaxBodyBytes int64
	// Scheme is "http" (default) or "https".
	Scheme string
	// Dialects overrides the built-in engine dialects for the whole pool, keyed by engine
	// (model.aibrix.ai/engine); it may also add engines. Empty fields keep the built-in value.
	Dialects map[string]Dialect
	// Client performs the scrapes; default: keep-alive transport sized for the pool, no gzip.
	Client *http.Client
	// Observer receives scrape outcomes for Tandem's own metrics (telemetry.Metrics); may be nil.
	Observer Observer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Observer is told what the scraper sees. telemetry.Metrics implements it.
type Observer interface {
	// ScrapeDone reports one scrape; errClass is "" on success, else one of the ErrClass values.
	ScrapeDone(ep *pool.Endpoint, took time.Duration, errClass string)
	// EndpointSample reports the sample just published for an endpoint (never stale).
	EndpointSample(ep *pool.Endpoint, s *Sample)
	// EndpointStale reports an endpoint going stale (true) or recovering (false).
	EndpointStale(ep *pool.Endpoint, stale bool)
	// EndpointGone reports an endpoint that left the pool: drop its series.
	EndpointGone(ep *pool.Endpoint)
	// ConfigError reports a bad per-pod annotation (the scraper falls back to the dialect).
	ConfigError(ep *pool.Endpoint, source string, err error)
	// PoolChanged reports each new pool snapshot.
	PoolChanged(snap *pool.Snapshot)
}

// Scrape error classes, bounded for metric labels.
const (
	ErrClassTimeout    = "timeout"
	ErrClassConnect    = "connect"
	ErrClassHTTPStatus = "http_status"
	ErrClassTooLarge   = "too_large"
	ErrClassParse      = "parse"
	ErrClassCanceled   = "canceled"
)

// IntervalFromEnv reads AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS (unset: DefaultInterval).
func IntervalFromEnv(getenv func(string) string) (time.Duration, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	v := getenv(EnvRefreshInterval)
	if v == "" {
		return DefaultInterval, nil
	}
	ms, err := strconv.Atoi(v)
	if err != nil || ms <= 0 {
		return 0, fmt.Errorf("%s=%q: must be a positive whole number of milliseconds, e.g. 1000", EnvRefreshInterval, v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Scraper keeps one Sample per endpoint of the pool fresh in a Store.
type Scraper struct {
	pool    *pool.Store
	samples *Store
	opts    ScrapeOptions
	dialect map[string]*mapping
	want    map[string]map[string]bool // per dialect engine: families to keep (built once)
	obs     Observer

	mu      sync.Mutex // guards targets and synced
	targets map[string]*target
	synced  *pool.Snapshot // the snapshot targets were last aligned with
	jobs    chan *target
}

// target is the scraper's state for one endpoint. Only the worker holding inflight touches
// the scrape fields; removed is set under mu by the dispatcher.
type target struct {
	inflight atomic.Bool

	mu         sync.Mutex
	ep         *pool.Endpoint
	cfg        *mapping
	url        string
	want       map[string]bool
	removed    bool
	prev       *reading // last good reading
	prevSample *Sample
	lastGood   time.Time
	firstTry   time.Time
	stale      bool
}

// NewScraper validates the options and builds a scraper over the pool and sample stores.
func NewScraper(store *pool.Store, samples *Store, opts ScrapeOptions) (*Scraper, error) {
	if store == nil || samples == nil {
		return nil, errors.New("metrics.NewScraper: pool store and sample store are required")
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Interval < 0 {
		return nil, fmt.Errorf("ScrapeOptions.Interval=%s: must be positive", opts.Interval)
	}
	if opts.Timeout == 0 {
		opts.Timeout = min(opts.Interval, time.Second)
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("ScrapeOptions.Timeout=%s: must be positive", opts.Timeout)
	}
	if opts.StaleAfter == 0 {
		opts.StaleAfter = max(defaultStaleIntervals*opts.Interval, minStaleAfter)
	}
	if opts.StaleAfter <= opts.Interval {
		return nil, fmt.Errorf("ScrapeOptions.StaleAfter=%s: must exceed the interval %s, or every pod flaps stale", opts.StaleAfter, opts.Interval)
	}
	if opts.Workers == 0 {
		opts.Workers = DefaultWorkers
	}
	if opts.Workers < 0 {
		return nil, fmt.Errorf("ScrapeOptions.Workers=%d: must be positive", opts.Workers)
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("ScrapeOptions.MaxBodyBytes=%d: must be positive", opts.MaxBodyBytes)
	}
	switch opts.Scheme {
	case "":
		opts.Scheme = "http"
	case "http", "https":
	default:
		return nil, fmt.Errorf("ScrapeOptions.Scheme=%q: must be http or https", opts.Scheme)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Client == nil {
		opts.Client = defaultClient(opts.Timeout)
	}
	s := &Scraper{pool: store, samples: samples, opts: opts, obs: opts.Observer,
		dialect: map[string]*mapping{}, want: map[string]map[string]bool{}, targets: map[string]*target{}}
	engines := map[string]bool{}
	for e := range builtinDialects {
		engines[e] = true
	}
	for e := range opts.Dialects {
		engines[e] = true
	}
	for e := range engines {
		base := &mapping{sel: map[Field][]Selector{}}
		if b, ok := builtinDialects[e]; ok {
			var err error
			if base, err = resolveDialect(base, b, "built-in dialect "+e); err != nil {
				return nil, err
			}
		}
		m, err := resolveDialect(base, opts.Dialects[e], "ScrapeOptions.Dialects["+e+"]")
		if err != nil {
			return nil, err
		}
		if m.path == "" {
			m.path = "/metrics"
		}
		s.dialect[e] = m
		s.want[e] = wantSet(m)
	}
	return s, nil
}

func wantSet(m *mapping) map[string]bool {
	w := map[string]bool{}
	for _, n := range m.families() {
		w[n] = true
	}
	return w
}

func defaultClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          0, // no global cap: one kept-alive connection per endpoint
			MaxIdleConnsPerHost:   2,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: timeout,
			// Engines gzip when asked; on a cluster network that costs both sides CPU for nothing.
			DisableCompression: true,
		},
	}
}

// Interval is the effective scrape interval.
func (s *Scraper) Interval() time.Duration { return s.opts.Interval }

// Run scrapes until ctx ends. Endpoints that leave the pool are forgotten as soon as the pool
// changes; each endpoint is scraped once per interval, at most one scrape in flight per endpoint.
func (s *Scraper) Run(ctx context.Context) error {
	s.jobs = make(chan *target)
	var wg sync.WaitGroup
	for range s.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range s.jobs {
				s.scrape(ctx, t)
				t.inflight.Store(false)
			}
		}()
	}
	defer func() {
		close(s.jobs)
		wg.Wait()
	}()

	changes := s.pool.Changes()
	tick := time.NewTicker(s.opts.Interval)
	defer tick.Stop()
	s.sync(s.pool.Load())
	s.dispatch(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
			s.sync(s.pool.Load())
		case <-tick.C:
			s.sync(s.pool.Load())
			s.dispatch(ctx)
		}
	}
}

// sync aligns the targets with a pool snapshot: new endpoints get a target, changed ones a new
// configuration, and gone ones are removed from the sample store and the observer.
func (s *Scraper) sync(snap *pool.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if snap == s.synced {
		return
	}
	s.synced = snap
	seen := make(map[string]bool, len(snap.Endpoints))
	for _, ep := range snap.Endpoints {
		key := ep.Key()
		seen[key] = true
		t, ok := s.targets[key]
		if !ok {
			t = &target{}
			s.targets[key] = t
		}
		t.mu.Lock()
		if t.ep != ep {
			s.configure(t, ep)
		}
		t.mu.Unlock()
	}
	for key, t := range s.targets {
		if seen[key] {
			continue
		}
		t.mu.Lock()
		t.removed = true
		ep := t.ep
		t.mu.Unlock()
		delete(s.targets, key)
		s.samples.Delete(key)
		if s.obs != nil {
			s.obs.EndpointGone(ep)
		}
	}
	if s.obs != nil {
		s.obs.PoolChanged(snap)
	}
}

// configure resolves where and what to scrape for an endpoint. Called with t.mu held.
func (s *Scraper) configure(t *target, ep *pool.Endpoint) {
	t.ep = ep
	m, ok := s.dialect[ep.Engine]
	want := s.want[ep.Engine]
	if !ok {
		m, want = s.dialect[pool.EngineVLLM], s.want[pool.EngineVLLM]
		if s.obs != nil {
			s.obs.ConfigError(ep, "label "+pool.LabelEngine,
				fmt.Errorf("engine %q has no metrics dialect; scraping it as vLLM. Set the label to vllm, sglang or trtllm, or add ScrapeOptions.Dialects[%q]", ep.Engine, ep.Engine))
		}
	}
	if over, has, err := podOverride(ep.Annotations); has {
		if err == nil {
			var pm *mapping
			if pm, err = resolveDialect(m, over, "pod "+ep.PodKey()); err == nil {
				m, want = pm, wantSet(pm)
			}
		}
		if err != nil && s.obs != nil {
			s.obs.ConfigError(ep, "annotation", err)
		}
	}
	port := ep.Port
	if m.port != 0 {
		port = m.port
	}
	t.cfg, t.want = m, want
	t.url = s.opts.Scheme + "://" + net.JoinHostPort(ep.Address, strconv.Itoa(int(port))) + m.path
}

// ScrapeNow scrapes one endpoint once and returns what it read, without publishing it or
// deriving the two-scrape signals (throughput from counters). For diagnostics and benchmarks.
func (s *Scraper) ScrapeNow(ctx context.Context, ep *pool.Endpoint) (*Sample, error) {
	t := &target{}
	s.configure(t, ep)
	r, _, err := s.fetch(ctx, t.url, t.cfg, t.want)
	if err != nil {
		return nil, err
	}
	return toSample(r, nil, nil), nil
}

// dispatch hands every idle target to the workers; a target still in flight is skipped.
func (s *Scraper) dispatch(ctx context.Context) {
	s.mu.Lock()
	ts := make([]*target, 0, len(s.targets))
	for _, t := range s.targets {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	for _, t := range ts {
		if !t.inflight.CompareAndSwap(false, true) {
			continue
		}
		select {
		case s.jobs <- t:
		case <-ctx.Done():
			t.inflight.Store(false)
			return
		}
	}
}

// scrape fetches and parses one endpoint and publishes the result.
func (s *Scraper) scrape(ctx context.Context, t *target) {
	t.mu.Lock()
	ep, url, cfg, want := t.ep, t.url, t.cfg, t.want
	t.mu.Unlock()

	start := s.opts.Now()
	r, class, err := s.fetch(ctx, url, cfg, want)
	took := s.opts.Now().Sub(start)
	if class == ErrClassCanceled && ctx.Err() != nil {
		return // shutting down: not the pod's fault
	}

	// Observer calls happen under t.mu so none can land after sync removed the endpoint and
	// told the observer it is gone (which would leave its series behind for good).
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removed {
		return
	}
	if s.obs != nil {
		s.obs.ScrapeDone(ep, took, class)
	}
	now := s.opts.Now()
	if t.firstTry.IsZero() {
		t.firstTry = now
	}
	if err != nil {
		since := t.lastGood
		if since.IsZero() {
			since = t.firstTry
		}
		if !t.stale && now.Sub(since) >= s.opts.StaleAfter {
			t.stale = true
			if !t.lastGood.IsZero() {
				// Keep what the engine told us about itself; drop every load reading.
				s.samples.Put(ep.Key(), &Sample{UpdatedAt: t.lastGood, Stale: true,
					BlockSize: t.prevSample.BlockSize, NumGPUBlocks: t.prevSample.NumGPUBlocks})
			}
			if s.obs != nil {
				s.obs.EndpointStale(ep, true)
			}
		}
		return
	}
	smp := toSample(r, t.prev, t.prevSample)
	t.prev, t.prevSample, t.lastGood = &r, smp, r.at
	s.samples.Put(ep.Key(), smp)
	if s.obs != nil {
		if t.stale {
			s.obs.EndpointStale(ep, false)
		}
		s.obs.EndpointSample(ep, smp)
	}
	t.stale = false
}

// acceptHeader asks for the classic text format only. Python's prometheus_client (vLLM, SGLang,
// TensorRT-LLM) answers OpenMetrics whenever the header mentions it at all, whatever its q-value,
// and expfmt's OpenMetrics parser is far slower than its text parser. A server that sends
// OpenMetrics anyway is still parsed, by its Content-Type.
const acceptHeader = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

func (s *Scraper) fetch(ctx context.Context, url string, cfg *mapping, want map[string]bool) (reading, string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return reading{}, ErrClassConnect, err
	}
	req.Header.Set("Accept", acceptHeader)
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return reading{}, classify(ctx, err), err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return reading{}, ErrClassHTTPStatus, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	body := &limitReader{r: resp.Body, n: s.opts.MaxBodyBytes}
	fams, err := decodeFamilies(body, resp.Header.Get("Content-Type"), want)
	if err != nil {
		if errors.Is(err, errBodyTooLarge) {
			return reading{}, ErrClassTooLarge, fmt.Errorf("GET %s: %w (%d bytes)", url, err, s.opts.MaxBodyBytes)
		}
		if ctx.Err() != nil {
			return reading{}, classify(ctx, ctx.Err()), err
		}
		return reading{}, ErrClassParse, fmt.Errorf("GET %s: %w", url, err)
	}
	return extract(fams, cfg, s.opts.Now()), "", nil
}

func classify(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return ErrClassTimeout
	case errors.Is(err, context.Canceled):
		return ErrClassCanceled
	}
	return ErrClassConnect
}

func headerWithContentType(ct string) http.Header {
	h := http.Header{}
	h.Set("Content-Type", ct)
	return h
}
