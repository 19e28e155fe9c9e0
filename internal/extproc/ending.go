package extproc

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"time"
)

// How a stream the gateway ends early is attributed (docs/stream-endings.md has the whole
// table). Envoy ends an ext_proc stream in one way only: ExternalProcessorStreamImpl::close()
// half-closes it (an empty DATA frame with END_STREAM) and then resets it (RST_STREAM), and its
// HTTP/2 codec defers the reset until the END_STREAM frame is written. It does so when the
// downstream request is destroyed (the client reset or closed its connection, or Envoy reset
// the downstream because the upstream failed after the response had started), after the last
// response message it expects, and on its own ext_proc errors. Tandem's Recv therefore sees
// io.EOF followed by a cancelled context, or the cancellation alone when the reset is read
// first. A pod Envoy could not reach, or that did not answer within the route timeout, is
// reported differently: the router's local reply (503, 504, ...) goes through the ext_proc
// filter's response phase like any response, so the stream sees its status.
//
// Hence an early end says nothing against the destination:
//   - before the response headers, the client (or the gateway on its behalf) went away:
//     the caller's ending. It releases every tracker and ledger charge as a completed request
//     does, and passive health and the latency models learn nothing of the pod from it;
//   - after the response headers but before the response is complete, the client left or the
//     upstream broke mid-response, which the stream cannot tell apart: nothing is blamed, the
//     pod's own probes and scrapes judge it;
//   - once the response is complete by its content (the server-sent events' final
//     "data: [DONE]", or as many body bytes as its content-length), the request succeeded,
//     whatever ends the stream afterwards.

// abandonSettle bounds the wait, after a half-close that arrives before the end of the
// request, for the reset that follows it when the gateway is tearing the stream down (Envoy
// writes both frames together). A reset within it means the client left during its request:
// nothing is decided. Without one, the half-close is taken as the end of the request.
const abandonSettle = 250 * time.Millisecond

// abandoned reports whether the stream's context is cancelled within abandonSettle.
func (st *stream) abandoned() bool {
	if st.ctx.Err() != nil {
		return true
	}
	t := time.NewTimer(abandonSettle)
	defer t.Stop()
	select {
	case <-st.ctx.Done():
		return true
	case <-t.C:
		return false
	}
}

// endedBeforeResponse is the lifecycle's error for a stream the gateway ended after routing
// and before any response status: the caller's ending. It matches ErrStreamEnded and
// context.Canceled (the client went away), and unwraps to what Recv returned.
type endedBeforeResponse struct{ cause error }

func (e *endedBeforeResponse) Error() string {
	return "the gateway ended the stream before the response started (the client went away): " + e.cause.Error()
}

func (e *endedBeforeResponse) Is(target error) bool {
	return target == ErrStreamEnded || target == context.Canceled
}

func (e *endedBeforeResponse) Unwrap() error { return e.cause }

// earlyEnd is how the lifecycle ends when the gateway ended the stream (cause: what Recv
// returned, or ErrStreamEnded) before Tandem saw the response's end: nil when the response
// was complete by its content, the caller's ending before the response headers, else cause
// (a response cut short, by the client or by the upstream).
func (st *stream) earlyEnd(cause error) error {
	switch {
	case st.resp.complete():
		return nil
	case !st.respHeaders:
		return &endedBeforeResponse{cause: cause}
	}
	return cause
}

// doneMarker is the last event of an OpenAI-style server-sent event stream.
var doneMarker = []byte("[DONE]")

// responseProgress follows a response's body to tell when it is complete by its content,
// before (or without) the gateway's end_of_stream.
type responseProgress struct {
	started bool  // the response headers were read
	length  int64 // content-length, -1 when absent
	bytes   int64
	sse     bool   // text/event-stream
	tail    []byte // the end of the last chunk, for a marker split between chunks
	done    bool   // "data: [DONE]" seen
}

// headers reads the response headers (lower-case keys).
func (p *responseProgress) headers(h map[string]string) {
	p.started, p.length = true, -1
	if v, ok := h["content-length"]; ok {
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n >= 0 {
			p.length = n
		}
	}
	ct := strings.ToLower(h["content-type"])
	p.sse = strings.HasPrefix(strings.TrimSpace(ct), "text/event-stream")
}

// chunk reads one body chunk.
func (p *responseProgress) chunk(b []byte) {
	p.bytes += int64(len(b))
	if !p.sse || p.done || len(b) == 0 {
		return
	}
	window := b
	if len(p.tail) > 0 {
		window = append(append(make([]byte, 0, len(p.tail)+len(b)), p.tail...), b...)
	}
	p.done = hasDoneEvent(window, len(p.tail) == 0 && p.bytes == int64(len(b)))
	const keep = 16 // longer than "\ndata: [DONE]"
	if len(window) > keep {
		window = window[len(window)-keep:]
	}
	p.tail = append(p.tail[:0], window...)
}

// complete reports a response whose content is all there.
func (p *responseProgress) complete() bool {
	return p.started && (p.done || (p.length >= 0 && p.bytes >= p.length))
}

// hasDoneEvent finds a "data: [DONE]" (or "data:[DONE]") line in b; atStart says b begins the
// body (a line may start there).
func hasDoneEvent(b []byte, atStart bool) bool {
	for off := 0; ; {
		i := bytes.Index(b[off:], doneMarker)
		if i < 0 {
			return false
		}
		i += off
		j := i
		if j > 0 && b[j-1] == ' ' {
			j--
		}
		if j >= 5 && string(b[j-5:j]) == "data:" {
			k := j - 5
			if (k == 0 && atStart) || (k > 0 && (b[k-1] == '\n' || b[k-1] == '\r')) {
				return true
			}
		}
		off = i + len(doneMarker)
	}
}
