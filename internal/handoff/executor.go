package handoff

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// DefaultMaxResponseBytes bounds a prefill response: a one-token answer, plus prompt_token_ids
// for TensorRT-LLM (a 1M-token prompt is about 8 MiB of ids).
const DefaultMaxResponseBytes = 16 << 20

// Call is one prefill HTTP request.
type Call struct {
	Target *pool.Endpoint
	// Path is the request path (with any query) on the target.
	Path string
	// Headers are the client's request headers, lower-case; hop-by-hop and Tandem control
	// headers are dropped before sending.
	Headers   map[string]string
	RequestID string
	Body      []byte
	// Timeout bounds the whole call (AIBRIX_PREFILL_REQUEST_TIMEOUT); 0 means only ctx does.
	Timeout time.Duration
}

// Executor sends prefill legs over a pooled HTTP client. Safe for concurrent use.
type Executor struct {
	client   *http.Client
	maxBytes int64
}

// NewExecutor returns an executor with its own connection pool. maxResponseBytes ≤ 0 takes
// DefaultMaxResponseBytes.
func NewExecutor(maxResponseBytes int64) *Executor {
	if maxResponseBytes <= 0 {
		maxResponseBytes = DefaultMaxResponseBytes
	}
	tr := &http.Transport{
		// Never through a proxy from the environment: these are pod addresses.
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	return &Executor{
		client: &http.Client{Transport: tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		maxBytes: maxResponseBytes,
	}
}

// Close drops idle connections.
func (x *Executor) Close() { x.client.CloseIdleConnections() }

// Do sends the call and returns the response body (valid JSON) or a classified failure.
func (x *Executor) Do(ctx context.Context, c Call) ([]byte, *Failure) {
	callCtx, cancel := ctx, context.CancelFunc(func() {})
	if c.Timeout > 0 {
		callCtx, cancel = context.WithTimeout(ctx, c.Timeout)
	}
	defer cancel()
	if c.Target == nil {
		return nil, &Failure{Class: ClassRequestSetup, Err: errors.New("no prefill endpoint")}
	}
	path := c.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(callCtx, http.MethodPost, "http://"+c.Target.HostPort()+path, bytes.NewReader(c.Body))
	if err != nil {
		return nil, &Failure{Class: ClassRequestSetup, Err: err}
	}
	// Headers the client's Connection header names are hop-by-hop too.
	var listed []string
	for _, name := range strings.Split(c.Headers["connection"], ",") {
		listed = append(listed, strings.ToLower(strings.TrimSpace(name)))
	}
	for k, v := range c.Headers {
		if forwardable(k) && !slices.Contains(listed, strings.ToLower(k)) {
			req.Header.Set(k, v)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	if c.RequestID != "" {
		req.Header.Set("X-Request-Id", c.RequestID)
	}
	resp, err := x.client.Do(req)
	if err != nil {
		return nil, classify(ctx, c, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, x.maxBytes+1))
	if err != nil {
		return nil, classify(ctx, c, fmt.Errorf("reading the response: %w", err))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &Failure{Class: ClassHTTPStatus, EngineStatus: resp.StatusCode,
			Err: fmt.Errorf("%s answered %d: %s", c.Target.PodKey(), resp.StatusCode, snippet(body))}
	}
	if int64(len(body)) > x.maxBytes {
		return nil, &Failure{Class: ClassBadResponse, Err: fmt.Errorf("%s: response exceeds %d bytes", c.Target.PodKey(), x.maxBytes)}
	}
	if request.TooDeep(body, request.MaxJSONDepth) { // before gjson, whose recursion would overflow the stack
		return nil, &Failure{Class: ClassBadResponse, Err: fmt.Errorf("%s: response nests JSON more than %d levels deep", c.Target.PodKey(), request.MaxJSONDepth)}
	}
	if !gjson.ValidBytes(body) {
		return nil, &Failure{Class: ClassBadResponse, Err: fmt.Errorf("%s: response is not valid JSON: %s", c.Target.PodKey(), snippet(body))}
	}
	return body, nil
}

// classify names a transport-level error: cancelled by the caller, timed out, or a connection failure.
func classify(parent context.Context, c Call, err error) *Failure {
	where := c.Target.PodKey()
	var ne net.Error
	switch {
	case errors.Is(parent.Err(), context.Canceled):
		return &Failure{Class: ClassCanceled, Err: fmt.Errorf("%s: request cancelled: %w", where, err)}
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		if c.Timeout <= 0 {
			return &Failure{Class: ClassTimeout, Err: fmt.Errorf("%s: %w", where, err)}
		}
		return &Failure{Class: ClassTimeout, Err: fmt.Errorf("%s: no complete answer within %s", where, c.Timeout)}
	case errors.Is(err, context.Canceled):
		return &Failure{Class: ClassCanceled, Err: fmt.Errorf("%s: request cancelled: %w", where, err)}
	}
	return &Failure{Class: ClassTransport, Err: fmt.Errorf("%s: %w", where, err)}
}

// forwardable says whether a client header may travel on the prefill leg: not HTTP/2 pseudo
// headers, not hop-by-hop headers, not headers the transport sets itself, and not Tandem's or
// the Inference Extension's control headers (a client must not steer the prefill leg).
func forwardable(name string) bool {
	name = strings.ToLower(name)
	if strings.HasPrefix(name, ":") || strings.HasPrefix(name, "x-gateway-") || strings.HasPrefix(name, "x-tandem-") {
		return false
	}
	switch name {
	case "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
		"te", "trailer", "transfer-encoding", "upgrade",
		"host", "content-length", "content-type", "accept-encoding", "expect",
		wire.HeaderPrefillerHostPort, wire.HeaderEncoderHostsPorts, "x-envoy-original-dst-host",
		"test-epp-endpoint-selection":
		return false
	}
	return true
}

// snippet is a bounded, single-line excerpt of a body for error messages.
func snippet(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	return truncate(s, 160)
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
