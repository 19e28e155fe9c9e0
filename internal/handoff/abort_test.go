package handoff

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

// abortServer is an SGLang decode pod's /abort_request; each call's body is sent on got, and
// answered with the next status of statuses (200 when exhausted; 0 hangs until the caller leaves).
func abortServer(t *testing.T, statuses ...int) (*pool.Endpoint, chan string) {
	t.Helper()
	got := make(chan string, 8)
	next := make(chan int, len(statuses))
	for _, s := range statuses {
		next <- s
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/abort_request" || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("unexpected %s %s %q", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		}
		got <- string(b)
		status := http.StatusOK
		select {
		case status = <-next:
		default:
		}
		if status == 0 {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return serverEndpoint(t, srv, "decode-0", pool.EngineSGLang, nil, nil), got
}

func TestAbortRetriesOnceAfterTheDelay(t *testing.T) {
	decode, got := abortServer(t, http.StatusNotFound) // the rid is not registered yet at first
	clock := newFakeClock()
	a := NewAborter(nil, clock)
	res := make(chan AbortResult, 1)
	go func() {
		res <- a.Abort(context.Background(), decode, "req-1-0000000a00000001", AbortPolicy{Timeout: time.Second, RetryDelay: 2 * time.Second}, true)
	}()
	if b := <-got; b != `{"rid":"req-1-0000000a00000001"}` {
		t.Errorf("first abort body %s", b)
	}
	if d := <-clock.afters; d != 2*time.Second {
		t.Errorf("retry delay %s, want 2s", d)
	}
	clock.Advance(1999 * time.Millisecond)
	select {
	case b := <-got:
		t.Fatalf("retried before the delay: %s", b)
	default:
	}
	clock.Advance(time.Millisecond)
	if b := <-got; b != `{"rid":"req-1-0000000a00000001"}` {
		t.Errorf("second abort body %s", b)
	}
	if r := <-res; r != AbortOK {
		t.Errorf("result %s, want ok (second attempt succeeded)", r)
	}
}

func TestAbortRetrySkippedOnceDecodeResponds(t *testing.T) {
	decode, got := abortServer(t, http.StatusNotFound)
	clock := newFakeClock()
	a := NewAborter(nil, clock)
	stop, responded := context.WithCancel(context.Background())
	res := make(chan AbortResult, 1)
	go func() {
		res <- a.Abort(stop, decode, "r", AbortPolicy{Timeout: time.Second, RetryDelay: 2 * time.Second}, true)
	}()
	<-got
	<-clock.afters
	responded()
	if r := <-res; r != AbortError {
		t.Errorf("result %s, want error (only the 404 attempt ran)", r)
	}
	clock.Advance(time.Hour)
	select {
	case b := <-got:
		t.Errorf("retried after the decode leg responded: %s", b)
	default:
	}
}

func TestAbortSingleAttemptsAndSkips(t *testing.T) {
	cases := []struct {
		name     string
		rid      string
		noTarget bool
		policy   AbortPolicy
		retry    bool
		statuses []int
		want     AbortResult
		attempts int
	}{
		{name: "watchdog variant: one attempt", rid: "r", policy: AbortPolicy{time.Second, 2 * time.Second}, want: AbortOK, attempts: 1},
		{name: "retry delay 0: one attempt", rid: "r", policy: AbortPolicy{time.Second, 0}, retry: true, statuses: []int{500}, want: AbortError, attempts: 1},
		{name: "attempt timeout", rid: "r", policy: AbortPolicy{100 * time.Millisecond, 0}, statuses: []int{0}, want: AbortError, attempts: 1},
		{name: "timeout 0 disables", rid: "r", policy: AbortPolicy{0, 2 * time.Second}, retry: true, want: AbortSkippedDisabled},
		{name: "no rid", policy: AbortPolicy{time.Second, 0}, want: AbortSkippedNoRID},
		{name: "no decode target", rid: "r", noTarget: true, policy: AbortPolicy{time.Second, 0}, want: AbortSkippedNoTarget},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			decode, got := abortServer(t, c.statuses...)
			if c.noTarget {
				decode = nil
			}
			a := NewAborter(nil, newFakeClock())
			if r := a.Abort(context.Background(), decode, c.rid, c.policy, c.retry); r != c.want {
				t.Errorf("result %s, want %s", r, c.want)
			}
			for i := 0; i < c.attempts; i++ {
				<-got
			}
			if len(got) != 0 {
				t.Errorf("%d attempts, want %d", c.attempts+len(got), c.attempts)
			}
		})
	}
}
