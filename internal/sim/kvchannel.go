package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The KV side channel is a second listener per pod through which PD legs meet: a vLLM decode
// pulls held blocks from remote_host:remote_port, an SGLang decode joins its room at the
// prefill's bootstrap server, a TensorRT-LLM generation leg fetches its context from the
// ctx_info_endpoint. Its paths are the simulator's own, not any engine's.

// kvTable is a rendezvous of named slots: put leaves a value (kept for a TTL), take removes
// it, waiting up to a bound for it to arrive.
type kvTable struct {
	mu     sync.Mutex
	slots  map[string]*slot
	closed chan struct{}
	once   sync.Once
}

type slot struct {
	ready   chan struct{} // closed by put
	val     any
	waiting bool
	timer   *time.Timer
}

var (
	errSlotMissing = errors.New("not found")
	errSlotTimeout = errors.New("timed out")
	errSlotTaken   = errors.New("already has a value or a waiter")
)

func newKVTable() *kvTable { return &kvTable{slots: map[string]*slot{}, closed: make(chan struct{})} }

func (t *kvTable) close() { t.once.Do(func() { close(t.closed) }) }

// put leaves val under key for ttl; expire runs if nobody takes it in time.
func (t *kvTable) put(key string, val any, ttl time.Duration, expire func()) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	sl, ok := t.slots[key]
	if ok && !sl.waiting {
		return errSlotTaken
	}
	if !ok {
		sl = &slot{ready: make(chan struct{})}
		t.slots[key] = sl
	}
	sl.val = val
	sl.waiting = false
	close(sl.ready)
	sl.timer = time.AfterFunc(ttl, func() {
		t.mu.Lock()
		cur, ok := t.slots[key]
		if ok && cur == sl {
			delete(t.slots, key)
		}
		t.mu.Unlock()
		if ok && cur == sl && expire != nil {
			expire()
		}
	})
	return nil
}

// vacant reports whether put would accept key: nothing is there, or only a waiter.
func (t *kvTable) vacant(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	sl, ok := t.slots[key]
	return !ok || sl.waiting
}

// take removes and returns the value under key, waiting up to wait for a put.
func (t *kvTable) take(ctx context.Context, key string, wait time.Duration) (any, error) {
	t.mu.Lock()
	sl, ok := t.slots[key]
	switch {
	case ok && !sl.waiting:
		delete(t.slots, key)
		sl.timer.Stop()
		t.mu.Unlock()
		return sl.val, nil
	case ok:
		t.mu.Unlock()
		return nil, errSlotTaken
	case wait <= 0:
		t.mu.Unlock()
		return nil, errSlotMissing
	}
	sl = &slot{ready: make(chan struct{}), waiting: true}
	t.slots[key] = sl
	t.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var err error
	select {
	case <-sl.ready:
	case <-timer.C:
		err = errSlotTimeout
	case <-ctx.Done():
		err = context.Cause(ctx)
	case <-t.closed:
		err = errors.New("pod closed")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-sl.ready: // a put won the race: take it anyway
		if t.slots[key] == sl {
			delete(t.slots, key)
		}
		sl.timer.Stop()
		return sl.val, nil
	default:
	}
	if t.slots[key] == sl {
		delete(t.slots, key)
	}
	return nil, err
}

func (s *Server) kvRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sim/kv/vllm/pull", s.handleVLLMPull)
	mux.HandleFunc("POST /sim/kv/sglang/join", s.handleSGLangJoin)
	mux.HandleFunc("POST /sim/kv/sglang/pull", s.handleSGLangPull)
	mux.HandleFunc("POST /sim/kv/trt/pull", s.handleTRTPull)
	return mux
}

// kvReply is the side channel's answer.
type kvReply struct {
	Tokens int    `json:"tokens,omitempty"`
	Error  string `json:"error,omitempty"`
	// Status is the HTTP status the decode leg should answer with when Error is set.
	Status int `json:"status,omitempty"`
}

func kvFail(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, kvReply{Error: fmt.Sprintf(format, args...), Status: status})
}

// callKV posts req to a peer's side channel. A peer that cannot be reached, or refuses, is a
// contract failure of the decode leg (400) unless the peer says otherwise.
func (s *Server) callKV(ctx context.Context, hostPort, path, field string, req any) (int, *httpError) {
	b, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+hostPort+path, bytes.NewReader(b))
	if err != nil {
		return 0, badRequest(field, "KV peer address %q is not usable: %v", hostPort, err)
	}
	resp, err := s.client.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil
		}
		return 0, badRequest(field, "cannot reach the KV peer at %s (%v): check %s", hostPort, err, field)
	}
	defer resp.Body.Close()
	var rep kvReply
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err := json.Unmarshal(body, &rep); err != nil {
		return 0, badRequest(field, "%s at %s is not a simulated pod's KV side channel (status %d): check %s", path, hostPort, resp.StatusCode, field)
	}
	if rep.Error != "" {
		st := rep.Status
		if st == 0 {
			st = http.StatusBadRequest
		}
		typ := "invalid_request_error"
		if st >= 500 {
			typ = "kv_transfer_error"
		}
		return 0, &httpError{status: st, typ: typ, param: field, msg: rep.Error}
	}
	return rep.Tokens, nil
}

// abortSet maps SGLang rids to the cancel functions of the requests carrying them, and of the
// KV finished prefill legs hold.
type abortSet struct {
	mu   sync.Mutex
	next int
	m    map[int]abortEntry
	log  []string
}

type abortEntry struct {
	rid    string
	cancel context.CancelCauseFunc
}

func newAbortSet() *abortSet { return &abortSet{m: map[int]abortEntry{}} }

func (a *abortSet) add(rid string, cancel context.CancelCauseFunc) (remove func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next++
	id := a.next
	a.m[id] = abortEntry{rid, cancel}
	return func() {
		a.mu.Lock()
		delete(a.m, id)
		a.mu.Unlock()
	}
}

// abort cancels every request (or held KV) whose rid starts with prefix and returns how many.
// The cancel functions run after the set's lock is released: one may remove its own entry.
func (a *abortSet) abort(prefix string) int {
	a.mu.Lock()
	a.log = append(a.log, prefix)
	var hit []context.CancelCauseFunc
	for _, e := range a.m {
		if prefix != "" && strings.HasPrefix(e.rid, prefix) {
			hit = append(hit, e.cancel)
		}
	}
	a.mu.Unlock()
	for _, cancel := range hit {
		cancel(errAborted)
	}
	return len(hit)
}

// Aborts lists the rids /abort_request was called with, in order.
func (s *Server) Aborts() []string {
	s.aborts.mu.Lock()
	defer s.aborts.mu.Unlock()
	return append([]string{}, s.aborts.log...)
}
