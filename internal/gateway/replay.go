package gateway

import (
	"errors"
	"io"
	"net/http"
	"sync"
)

// replayBody is the upstream request body as the EPP streams it back. It keeps every byte so
// that a connect failure can be retried on the next fallback endpoint from the start, and
// each reader streams: it returns bytes as they arrive and EOF only once the EPP has sent the
// last chunk (or the trailers).
type replayBody struct {
	mu       sync.Mutex
	data     []byte
	done     bool
	trailers http.Header
	changed  chan struct{} // closed and replaced on every update
}

func newReplayBody() *replayBody { return &replayBody{changed: make(chan struct{})} }

func (b *replayBody) update(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	f()
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *replayBody) append(p []byte) { b.update(func() { b.data = append(b.data, p...) }) }

// finish marks the end of the body; trailers (may be nil) go upstream after it.
func (b *replayBody) finish(trailers http.Header) {
	b.update(func() { b.done, b.trailers = true, trailers })
}

// reader starts a new read from byte 0. At EOF it copies the trailers into trailerDst (the
// upstream request's Trailer map, which net/http reads after the body).
func (b *replayBody) reader(trailerDst http.Header) io.ReadCloser {
	return &replayReader{b: b, dst: trailerDst, closed: make(chan struct{})}
}

var errReaderClosed = errors.New("gateway: upstream body reader closed")

type replayReader struct {
	b         *replayBody
	off       int
	dst       http.Header
	closeOnce sync.Once
	closed    chan struct{}
}

func (r *replayReader) Read(p []byte) (int, error) {
	for {
		r.b.mu.Lock()
		if r.off < len(r.b.data) {
			n := copy(p, r.b.data[r.off:])
			r.off += n
			r.b.mu.Unlock()
			return n, nil
		}
		if r.b.done {
			for k, v := range r.b.trailers {
				if r.dst != nil {
					r.dst[k] = v
				}
			}
			r.b.mu.Unlock()
			return 0, io.EOF
		}
		changed := r.b.changed
		r.b.mu.Unlock()
		select {
		case <-changed:
		case <-r.closed:
			return 0, errReaderClosed
		}
	}
}

func (r *replayReader) Close() error {
	r.closeOnce.Do(func() { close(r.closed) })
	return nil
}
