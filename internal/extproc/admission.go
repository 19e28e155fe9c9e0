package extproc

import (
	"sync/atomic"
	"time"
)

// Defaults of Limits (the epp flags --max-streams, --max-buffered-body-bytes,
// --request-body-timeout and --request-headers-timeout). With them, 200 streams each holding a 5 MiB partial body keep the
// process under 700 MiB: the budget holds about 38 of them and answers the others 503 at once.
const (
	DefaultMaxStreams           = 4096
	DefaultMaxBufferedBodyBytes = 192 << 20
	DefaultRequestBodyTimeout   = 60 * time.Second
	// DefaultRequestHeadersTimeout: a gateway opens an ext_proc stream when a request arrives
	// and sends its headers at once; a stream silent this long holds a slot for nothing.
	DefaultRequestHeadersTimeout = 10 * time.Second
)

// Limits bound what one client, or many, can make the server hold. A request over a limit is
// answered at once with an ImmediateResponse, never queued; the server stays healthy.
type Limits struct {
	// MaxStreams is how many ext_proc streams (requests) may be open at once; the next one is
	// answered 429 with Retry-After. A stream lives as long as its response: size it for the
	// requests in flight through one EPP replica. Zero means DefaultMaxStreams.
	MaxStreams int
	// MaxBufferedBodyBytes is the memory all streams together may hold in request bodies
	// while they arrive; a chunk that does not fit is answered 503 with Retry-After and its
	// stream's body dropped. A body that arrives whole in one message is never refused (it is
	// parsed and forwarded at once, not held waiting for more) but counts while it is held.
	// Zero means DefaultMaxBufferedBodyBytes.
	MaxBufferedBodyBytes int64
	// RequestBodyTimeout is how long a request body may take to arrive after its headers
	// (slow senders hold memory and a stream); past it the request is answered 408. Zero
	// means DefaultRequestBodyTimeout; negative disables it.
	RequestBodyTimeout time.Duration
	// RequestHeadersTimeout is how long a stream may stay open before its request headers
	// arrive; past it the stream ends with DeadlineExceeded and its slot is free again (a
	// stream that sends nothing would otherwise hold it for as long as it stays open). Zero
	// means DefaultRequestHeadersTimeout; negative disables it.
	RequestHeadersTimeout time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxStreams <= 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	if l.MaxBufferedBodyBytes <= 0 {
		l.MaxBufferedBodyBytes = DefaultMaxBufferedBodyBytes
	}
	if l.RequestBodyTimeout == 0 {
		l.RequestBodyTimeout = DefaultRequestBodyTimeout
	}
	if l.RequestHeadersTimeout == 0 {
		l.RequestHeadersTimeout = DefaultRequestHeadersTimeout
	}
	return l
}

// admission counts what the server's streams hold against Limits. Safe for concurrent use.
type admission struct {
	limits  Limits
	streams atomic.Int64
	bytes   atomic.Int64
	// testHookBytes, set by tests before the server runs, receives (without blocking) after
	// each change of bytes, so a test waits on the change instead of polling for it.
	testHookBytes chan struct{}
}

// enter admits one more stream, or reports the limit reached.
func (a *admission) enter() bool {
	if a.streams.Add(1) > int64(a.limits.MaxStreams) {
		a.streams.Add(-1)
		return false
	}
	return true
}

func (a *admission) leave() { a.streams.Add(-1) }

// reserve takes n bytes of the body budget; force takes them even past the budget.
func (a *admission) reserve(n int64, force bool) bool {
	if force {
		a.bytes.Add(n)
		a.bytesChanged()
		return true
	}
	for {
		used := a.bytes.Load()
		if used+n > a.limits.MaxBufferedBodyBytes {
			return false
		}
		if a.bytes.CompareAndSwap(used, used+n) {
			a.bytesChanged()
			return true
		}
	}
}

func (a *admission) release(n int64) {
	if n != 0 {
		a.bytes.Add(-n)
		a.bytesChanged()
	}
}

func (a *admission) bytesChanged() {
	if a.testHookBytes != nil {
		select {
		case a.testHookBytes <- struct{}{}:
		default:
		}
	}
}
