package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

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
	jobs    chan *target   // endpoints whose last scrape succeeded (or that are new)
	suspect chan *target   // endpoints whose last scrape failed
}

// target is the scraper's state for one endpoint. inflight admits one worker at a time; the
// fields below mu are guarded by it (the worker and sync both take it).
type target struct {
	inflight atomic.Bool
	failing  atomic.Bool  // the last scrape failed
	lastTry  atomic.Int64 // when the last scrape was handed to a worker (Unix ns), for fairness

	mu          sync.Mutex
	ep          *pool.Endpoint
	cfg         *mapping
	url         string
	servingPort bool // the scrape goes to the endpoint's serving port
	want        map[string]bool
	removed     bool
	prev        *reading // last good reading
	prevSample  *Sample
	lastGood    time.Time
	firstTry    time.Time
	stale       bool
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

// Interval is the effective scrape interval.
func (s *Scraper) Interval() time.Duration { return s.opts.Interval }

// Run scrapes until ctx ends. Endpoints that leave the pool are forgotten as soon as the pool
// changes; each endpoint is scraped once per interval, at most one scrape in flight per endpoint.
func (s *Scraper) Run(ctx context.Context) error {
	s.jobs, s.suspect = make(chan *target), make(chan *target)
	var wg sync.WaitGroup
	work := func(jobs <-chan *target) {
		defer wg.Done()
		for t := range jobs {
			s.scrape(ctx, t)
			t.inflight.Store(false)
		}
	}
	for range s.opts.Workers {
		wg.Add(1)
		go work(s.jobs)
	}
	for range max(s.opts.Workers/4, 2) {
		wg.Add(1)
		go work(s.suspect)
	}
	defer func() {
		close(s.jobs)
		close(s.suspect)
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
	t.cfg, t.want, t.servingPort = m, want, port == ep.Port
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
// Answering endpoints wait for a worker; failing ones go to the suspect workers, longest
// waiting first, and are skipped this round once those are all busy.
func (s *Scraper) dispatch(ctx context.Context) {
	s.mu.Lock()
	ts := make([]*target, 0, len(s.targets))
	for _, t := range s.targets {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	var suspects []*target
	for _, t := range ts {
		if t.failing.Load() {
			suspects = append(suspects, t)
			continue
		}
		if !t.inflight.CompareAndSwap(false, true) {
			continue
		}
		t.lastTry.Store(time.Now().UnixNano())
		select {
		case s.jobs <- t:
		case <-ctx.Done():
			t.inflight.Store(false)
			return
		}
	}
	sort.Slice(suspects, func(i, j int) bool { return suspects[i].lastTry.Load() < suspects[j].lastTry.Load() })
	for _, t := range suspects {
		if !t.inflight.CompareAndSwap(false, true) {
			continue
		}
		select {
		case s.suspect <- t:
			t.lastTry.Store(time.Now().UnixNano())
		default:
			t.inflight.Store(false)
			return
		}
	}
}

// scrape fetches and parses one endpoint and publishes the result.
func (s *Scraper) scrape(ctx context.Context, t *target) {
	t.mu.Lock()
	ep, url, cfg, want, serving := t.ep, t.url, t.cfg, t.want, t.servingPort
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
		if po, ok := s.obs.(ProbeObserver); ok {
			po.ScrapeProbed(ep, serving, took, class, err)
		}
	}
	t.failing.Store(err != nil)
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
	case errors.Is(err, syscall.ECONNREFUSED):
		return ErrClassRefused
	}
	return ErrClassConnect
}
