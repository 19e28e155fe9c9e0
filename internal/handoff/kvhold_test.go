package handoff

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// holdRecorder is a KVObserver that records what it is told.
type holdRecorder struct {
	mu       sync.Mutex
	ends     []HoldEnd
	seconds  []float64
	releases []ReleaseResult
	got      chan struct{}
}

func newHoldRecorder() *holdRecorder { return &holdRecorder{got: make(chan struct{}, 16)} }

func (r *holdRecorder) PrefillRelease(_ string, res ReleaseResult) {
	r.mu.Lock()
	r.releases = append(r.releases, res)
	r.mu.Unlock()
}

func (r *holdRecorder) StrandedKV(_ *pool.Endpoint, end HoldEnd, seconds float64) {
	r.mu.Lock()
	r.ends, r.seconds = append(r.ends, end), append(r.seconds, seconds)
	r.mu.Unlock()
	r.got <- struct{}{}
}

func TestKVHoldReportsOnce(t *testing.T) {
	p := endpoint("p", "10.0.0.1", 8000, pool.EngineSGLang, nil, nil)
	rec := newHoldRecorder()
	h := beginHold(rec, p, time.Hour)
	h.end(HoldConsumed)
	h.end(HoldReleased)
	h.end(HoldExpired)
	if len(rec.ends) != 1 || rec.ends[0] != HoldConsumed || rec.seconds[0] < 0 || rec.seconds[0] > 60 {
		t.Fatalf("ends %v seconds %v, want one consumed hold", rec.ends, rec.seconds)
	}
	var none *kvHold
	none.end(HoldConsumed) // an unmeasured hold is a no-op
	if beginHold(nil, p, time.Hour) != nil {
		t.Fatal("a hold without an observer should not be measured")
	}
}

func TestKVHoldExpiresAtTheTimeout(t *testing.T) {
	p := endpoint("p", "10.0.0.1", 8000, pool.EngineVLLM, nil, nil)
	rec := newHoldRecorder()
	h := beginHold(rec, p, 20*time.Millisecond)
	select {
	case <-rec.got:
	case <-time.After(10 * time.Second):
		t.Fatal("the hold never expired")
	}
	h.end(HoldReleased) // too late: already reported
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ends) != 1 || rec.ends[0] != HoldExpired || rec.seconds[0] != 0.02 {
		t.Fatalf("ends %v seconds %v, want one expired hold of the timeout (0.02 s)", rec.ends, rec.seconds)
	}
}

// kvEvents is the fixture's Observer plus the stranded-KV reports.
type kvEvents struct {
	events
	*holdRecorder
}

// releasePod is a prefill pod that answers its leg and records each /abort_request's rid;
// abortStatus is what it answers to those.
func releasePod(t *testing.T, abortStatus int, hang bool) (*httptest.Server, chan string, chan struct{}) {
	t.Helper()
	rids := make(chan string, 8)
	legs := make(chan struct{}, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/abort_request" {
			rids <- gjson.GetBytes(b, "rid").Str
			w.WriteHeader(abortStatus)
			return
		}
		legs <- struct{}{}
		if hang { // SGLang's leg, waiting for its decode pod to pull the KV
			<-r.Context().Done()
			return
		}
		_, _ = w.Write([]byte(`{"id":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1]}}`))
	}))
	t.Cleanup(srv.Close)
	return srv, rids, legs
}

// startKV runs a hand-off of engine to a releasePod until its prefill leg answered, or, with
// hang, until the leg is running (an SGLang pod answers it only once its KV was sent).
func startKV(t *testing.T, engine string, abortStatus int, hang bool) (*Handoff, *holdRecorder, chan string) {
	t.Helper()
	rec := newHoldRecorder()
	a, err := NewAdapters(config.DefaultPD(), Options{Observer: kvEvents{make(events, 32), rec}, KVHoldTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	srv, rids, legs := releasePod(t, abortStatus, hang)
	dec, _ := abortServer(t)
	h, err := a.New(context.Background(), Input{Leg: Leg{RequestID: "req-9", Path: "/v1/completions", API: request.APICompletions,
		Body: []byte(`{"model":"m","prompt":"p"}`), Prefill: serverEndpoint(t, srv, "p0", engine, nil, nil), Decode: dec}, PD: config.DefaultPD()})
	if err != nil {
		t.Fatal(err)
	}
	if _, aerr := h.Start(context.Background()); aerr != nil {
		t.Fatal(aerr)
	}
	if hang {
		<-legs
	} else {
		<-h.PrefillSucceeded()
	}
	return h, rec, rids
}

func (r *holdRecorder) snapshot() ([]HoldEnd, []ReleaseResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]HoldEnd(nil), r.ends...), append([]ReleaseResult(nil), r.releases...)
}

// A request that ends before its decode leg's first token releases an SGLang prefill pod's KV
// by its rid while its leg still waits to send it, and counts vLLM as unsupported; one whose
// first token came, or whose SGLang leg answered (its KV was sent), releases nothing.
func TestReleasePrefillOnEarlyEnd(t *testing.T) {
	t.Run("sglang released", func(t *testing.T) {
		h, rec, rids := startKV(t, pool.EngineSGLang, http.StatusOK, true)
		h.Done()
		waitBackground(t, h)
		if got := <-rids; got != h.RID() {
			t.Errorf("abort for rid %q, want %q", got, h.RID())
		}
		if ends, rel := rec.snapshot(); len(ends) != 1 || ends[0] != HoldReleased || len(rel) != 1 || rel[0] != ReleaseSent {
			t.Errorf("holds %v releases %v, want one released hold, one sent", ends, rel)
		}
	})
	t.Run("sglang abort fails", func(t *testing.T) {
		h, rec, rids := startKV(t, pool.EngineSGLang, http.StatusInternalServerError, true)
		h.Done()
		waitBackground(t, h)
		<-rids
		if ends, rel := rec.snapshot(); len(ends) != 0 || len(rel) != 1 || rel[0] != ReleaseFailed {
			t.Errorf("holds %v releases %v, want the hold still running and one failed release", ends, rel)
		}
	})
	t.Run("vllm unsupported", func(t *testing.T) {
		h, rec, rids := startKV(t, pool.EngineVLLM, http.StatusOK, false)
		h.Done()
		waitBackground(t, h)
		if ends, rel := rec.snapshot(); len(ends) != 0 || len(rel) != 1 || rel[0] != ReleaseUnsupported {
			t.Errorf("holds %v releases %v, want the hold still running and one unsupported", ends, rel)
		}
		if len(rids) != 0 {
			t.Error("a vLLM prefill pod got an /abort_request")
		}
	})
	for _, c := range []struct {
		name, engine string
		hang, first  bool
	}{
		{"sglang consumed", pool.EngineSGLang, true, true},
		{"sglang leg answered: KV sent", pool.EngineSGLang, false, false},
		{"vllm consumed", pool.EngineVLLM, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, rec, rids := startKV(t, c.engine, http.StatusOK, c.hang)
			if c.first {
				h.DecodeFirstToken()
			}
			h.Done()
			waitBackground(t, h)
			if ends, rel := rec.snapshot(); len(ends) != 1 || ends[0] != HoldConsumed || len(rel) != 0 {
				t.Errorf("holds %v releases %v, want one consumed hold and no release", ends, rel)
			}
			if len(rids) != 0 {
				t.Error("a prefill pod whose KV was consumed got an /abort_request")
			}
		})
	}
}

// An SGLang prefill leg's hold starts with the leg; a leg that fails by itself (an error status)
// held nothing: its hold is dropped, not reported, and the request's end releases nothing.
func TestSGLangFailedLegHoldsNothing(t *testing.T) {
	rec := newHoldRecorder()
	a, err := NewAdapters(config.DefaultPD(), Options{Observer: kvEvents{make(events, 32), rec}, KVHoldTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	dec, _ := abortServer(t)
	legDone := make(chan error, 1)
	h, err := a.New(context.Background(), Input{Leg: Leg{RequestID: "req-10", Path: "/v1/completions", API: request.APICompletions,
		Body: []byte(`{"model":"m","prompt":"p"}`), Prefill: serverEndpoint(t, srv, "p0", pool.EngineSGLang, nil, nil), Decode: dec},
		PD: config.DefaultPD(), PrefillDone: func(err error) { legDone <- err }})
	if err != nil {
		t.Fatal(err)
	}
	if _, aerr := h.Start(context.Background()); aerr != nil {
		t.Fatal(aerr)
	}
	if err := <-legDone; err == nil {
		t.Fatal("the prefill leg answered 500 but succeeded")
	}
	time.Sleep(100 * time.Millisecond) // past the hold timeout: an expiry would have been reported
	h.Done()
	waitBackground(t, h)
	if ends, rel := rec.snapshot(); len(ends) != 0 || len(rel) != 0 {
		t.Errorf("holds %v releases %v after a failed SGLang prefill leg, want none", ends, rel)
	}
}
