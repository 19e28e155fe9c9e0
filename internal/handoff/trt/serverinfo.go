package trt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// Defaults of the /server_info lookup, as the seed states them.
const (
	DefaultLookupTimeout = 3 * time.Second
	DefaultTTL           = time.Minute
	DefaultMaxEntries    = 1024
	// MaxServerInfoBytes caps the /server_info body read.
	MaxServerInfoBytes = 1 << 20
)

// Metadata is what a context worker reports for generation_first scheduling. The values are raw
// JSON, copied into the generation leg exactly as the worker wrote them.
type Metadata struct {
	// CtxInfoEndpoint is a non-empty string or a one-element array of one.
	CtxInfoEndpoint []byte
	// CtxDPRank is the attention data-parallel rank, an integer ≥ 0.
	CtxDPRank []byte
	// EncodedOpaqueState is optional (nil when absent).
	EncodedOpaqueState []byte
}

// ServerInfoOptions tune a ServerInfoCache; zero values take the defaults above.
type ServerInfoOptions struct {
	Client     *http.Client // must not follow redirects; nil builds one that does not
	Timeout    time.Duration
	TTL        time.Duration
	MaxEntries int
	Now        func() time.Time
	// Recovered, when set, is told about a panic recovered in a lookup (which then fails
	// with an error, so the requests waiting for it get a 503); nil ignores it.
	Recovered func(v any, stack []byte)
}

// ServerInfoCache looks up context workers' /server_info lazily. Concurrent lookups of one
// worker share one HTTP call; successes are kept for the TTL, failures are never kept. Each call
// runs on its own timeout, detached from the requests waiting for it, so a client that goes
// away does not fail the lookup for the others. Safe for concurrent use.
type ServerInfoCache struct {
	opts ServerInfoOptions

	mu       sync.Mutex
	entries  map[string]cached
	inflight map[string]*lookup

	// joined, when set by tests, runs after a caller joined a lookup and before it waits.
	joined func()
}

type cached struct {
	md      Metadata
	expires time.Time
}

type lookup struct {
	done chan struct{}
	md   Metadata
	err  error
}

// NewServerInfoCache returns an empty cache.
func NewServerInfoCache(opts ServerInfoOptions) *ServerInfoCache {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultLookupTimeout
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Client == nil {
		opts.Client = &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return &ServerInfoCache{opts: opts, entries: map[string]cached{}, inflight: map[string]*lookup{}}
}

// cacheKey names a worker incarnation as far as an Endpoint can tell: the pod and its address.
// (The seed also keys on container restart counts; a restarted pod keeping name and IP may be
// served stale metadata for at most one TTL.)
func cacheKey(ep *pool.Endpoint) string { return ep.Key() + "@" + ep.HostPort() }

// Lookup returns the worker's metadata, from the cache or from one shared HTTP call. ctx only
// bounds how long this caller waits.
func (c *ServerInfoCache) Lookup(ctx context.Context, ep *pool.Endpoint) (Metadata, error) {
	key := cacheKey(ep)
	c.mu.Lock()
	if e, ok := c.entries[key]; ok && c.opts.Now().Before(e.expires) {
		c.mu.Unlock()
		return e.md, nil
	}
	l, ok := c.inflight[key]
	if !ok {
		l = &lookup{done: make(chan struct{})}
		c.inflight[key] = l
		go c.run(key, ep, l)
	}
	c.mu.Unlock()
	if c.joined != nil {
		c.joined()
	}
	select {
	case <-l.done:
		return l.md, l.err
	case <-ctx.Done():
		return Metadata{}, fmt.Errorf("waiting for /server_info of %s: %w", ep.PodKey(), ctx.Err())
	}
}

func (c *ServerInfoCache) run(key string, ep *pool.Endpoint, l *lookup) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	l.md, l.err = c.guardedFetch(ctx, ep)
	cancel()
	c.mu.Lock()
	delete(c.inflight, key)
	if l.err == nil {
		c.evictLocked()
		c.entries[key] = cached{md: l.md, expires: c.opts.Now().Add(c.opts.TTL)}
	}
	c.mu.Unlock()
	close(l.done)
}

// guardedFetch is fetch on a goroutine of its own: a panic fails this lookup, not the process.
func (c *ServerInfoCache) guardedFetch(ctx context.Context, ep *pool.Endpoint) (md Metadata, err error) {
	defer func() {
		if r := recover(); r != nil {
			if c.opts.Recovered != nil {
				c.opts.Recovered(r, debug.Stack())
			}
			md, err = Metadata{}, fmt.Errorf("TRT context worker %s /server_info: internal error reading it: %v", ep.PodKey(), r)
		}
	}()
	return c.fetch(ctx, ep)
}

// evictLocked makes room for one entry: expired ones first, then any.
func (c *ServerInfoCache) evictLocked() {
	if len(c.entries) < c.opts.MaxEntries {
		return
	}
	now := c.opts.Now()
	for k, e := range c.entries {
		if !now.Before(e.expires) {
			delete(c.entries, k)
		}
	}
	for k := range c.entries {
		if len(c.entries) < c.opts.MaxEntries {
			break
		}
		delete(c.entries, k)
	}
}

func (c *ServerInfoCache) fetch(ctx context.Context, ep *pool.Endpoint) (Metadata, error) {
	where := fmt.Sprintf("TRT context worker %s (%s) /server_info", ep.PodKey(), ep.HostPort())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep.HostPort()+"/server_info", nil)
	if err != nil {
		return Metadata{}, fmt.Errorf("%s: %w", where, err)
	}
	resp, err := c.opts.Client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return Metadata{}, fmt.Errorf("%s: no answer within %s: %w", where, c.opts.Timeout, err)
		}
		return Metadata{}, fmt.Errorf("%s: %w", where, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxServerInfoBytes+1))
	if err != nil {
		return Metadata{}, fmt.Errorf("%s: reading body: %w", where, err)
	}
	if resp.StatusCode != http.StatusOK {
		return Metadata{}, fmt.Errorf("%s: status %d, want 200", where, resp.StatusCode)
	}
	if len(body) > MaxServerInfoBytes {
		return Metadata{}, fmt.Errorf("%s: body exceeds %d bytes", where, MaxServerInfoBytes)
	}
	md, err := ParseServerInfo(body)
	if err != nil {
		return Metadata{}, fmt.Errorf("%s: %w", where, err)
	}
	return md, nil
}

// ParseServerInfo validates a /server_info body and extracts the generation_first metadata.
func ParseServerInfo(body []byte) (Metadata, error) {
	const fix = "; generation_first needs TRT-LLM's Python KV transceiver (cache_transceiver_config.transceiver_runtime: PYTHON) on both roles, or set AIBRIX_TRT_SCHEDULE_STYLE=context_first"
	if request.TooDeep(body, request.MaxJSONDepth) { // before gjson, which recurses per level
		return Metadata{}, fmt.Errorf("body nests JSON more than %d levels deep%s", request.MaxJSONDepth, fix)
	}
	if !gjson.ValidBytes(body) {
		return Metadata{}, errors.New("body is not valid JSON" + fix)
	}
	dp := gjson.GetBytes(body, "disaggregated_params")
	if !dp.IsObject() {
		return Metadata{}, errors.New("disaggregated_params is missing or not an object" + fix)
	}
	var md Metadata
	ep := dp.Get("ctx_info_endpoint")
	switch {
	case ep.Type == gjson.String && ep.Str != "":
	case ep.IsArray() && len(ep.Array()) == 1 && ep.Array()[0].Type == gjson.String && ep.Array()[0].Str != "":
	case ep.IsArray() && len(ep.Array()) > 1:
		return Metadata{}, fmt.Errorf("disaggregated_params.ctx_info_endpoint lists %d endpoints; only one is supported", len(ep.Array()))
	default:
		return Metadata{}, errors.New("disaggregated_params.ctx_info_endpoint must be a non-empty string (or a one-element array of one)" + fix)
	}
	md.CtxInfoEndpoint = []byte(ep.Raw)
	rank := dp.Get("ctx_dp_rank")
	if rank.Type != gjson.Number || !isNonNegativeInteger(rank.Raw) {
		return Metadata{}, fmt.Errorf("disaggregated_params.ctx_dp_rank must be an integer ≥ 0, got %q%s", rank.Raw, fix)
	}
	md.CtxDPRank = []byte(rank.Raw)
	if s := dp.Get("encoded_opaque_state"); s.Exists() && s.Type != gjson.Null {
		md.EncodedOpaqueState = []byte(s.Raw)
	}
	return md, nil
}

// isNonNegativeInteger accepts JSON number literals made of digits only (no sign, fraction or exponent).
func isNonNegativeInteger(raw string) bool {
	if raw == "" {
		return false
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] < '0' || raw[i] > '9' {
			return false
		}
	}
	return true
}
