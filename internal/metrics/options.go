package metrics

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

// EnvRefreshInterval is the seed's setting for how often engine metrics are scraped.
const EnvRefreshInterval = "AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS"

// Defaults. DefaultInterval is measured, not guessed: bench/metrics scrapes 1024 endpoints
// serving a realistic vLLM V1 page (two engines, 69 KB); at 1 s scraping uses ~0.15 cores, under
// the 0.2-core budget, where AIBrix's 50 ms would need ~3 (docs/metrics.md). The seed's policies
// read load that changes on the scale of requests, and the gateway-side trackers (requests in
// flight, token ledgers) cover bursts shorter than the interval.
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
	// Workers bounds concurrent scrapes of answering endpoints (default 64). Endpoints whose
	// last scrape failed get a separate, smaller pool (Workers/4, at least 2), so pods that hang
	// until the timeout cannot starve the healthy ones.
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

// ProbeObserver is implemented by an Observer that also takes every scrape as a probe of its
// endpoint (passive health): whether it went to the serving port, how it ended (errClass "" on
// success), and the error.
type ProbeObserver interface {
	ScrapeProbed(ep *pool.Endpoint, servingPort bool, took time.Duration, errClass string, err error)
}

// Scrape error classes, bounded for metric labels.
const (
	ErrClassTimeout    = "timeout"
	ErrClassRefused    = "refused" // the connection was refused: nothing listens there
	ErrClassConnect    = "connect" // any other connection failure (reset, unreachable, DNS)
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
