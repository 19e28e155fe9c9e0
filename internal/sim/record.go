package sim

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Recorded is one request a pod received, with its exact body bytes.
type Recorded struct {
	Seq    uint64      `json:"seq"`
	Time   time.Time   `json:"time"`
	Method string      `json:"method"`
	Path   string      `json:"path"` // with the query string
	Header http.Header `json:"header"`
	Body   []byte      `json:"body"`      // base64 in JSON
	Text   string      `json:"body_text"` // the body as text, for reading
}

// recorder is a bounded ring of received requests.
type recorder struct {
	mu      sync.Mutex
	limit   int
	seq     uint64
	items   []Recorded
	changed chan struct{}
}

func newRecorder(limit int) *recorder { return &recorder{limit: limit, changed: make(chan struct{})} }

func (r *recorder) add(req *http.Request, body []byte) {
	r.addRecord(Recorded{Time: time.Now(), Method: req.Method, Path: req.URL.RequestURI(), Header: req.Header.Clone(), Body: body, Text: string(body)})
}

func (r *recorder) addRecord(rec Recorded) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	rec.Seq = r.seq
	r.items = append(r.items, rec)
	if len(r.items) > r.limit {
		r.items = append(r.items[:0:0], r.items[len(r.items)-r.limit:]...)
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) list() []Recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Recorded{}, r.items...)
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = nil
}

// Requests returns the recorded requests, oldest first (the ring keeps the newest RecordLimit).
// Scrapes, health checks and /sim/ control calls are not recorded.
func (s *Server) Requests() []Recorded { return s.rec.list() }

// ResetRequests empties the recorder.
func (s *Server) ResetRequests() { s.rec.reset() }

// WaitRequest blocks until a recorded request matches, or ctx ends.
func (s *Server) WaitRequest(ctx context.Context, match func(Recorded) bool) (Recorded, error) {
	for {
		s.rec.mu.Lock()
		ch := s.rec.changed
		items := s.rec.items
		s.rec.mu.Unlock()
		for _, it := range items {
			if match(it) {
				return it, nil
			}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return Recorded{}, fmt.Errorf("sim pod %s: no matching request among %d recorded: %w", s.cfg.Name, len(items), ctx.Err())
		}
	}
}
