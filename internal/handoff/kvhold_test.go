package handoff

import (
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
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
