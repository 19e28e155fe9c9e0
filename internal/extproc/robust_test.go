package extproc

import (
	"runtime"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
)

// TestRepeatedHeadersJoinInLinearMemory: a request_headers message repeating one header name
// many times used to be joined by string concatenation, copying the growing value for every
// repeat — quadratic time and memory (20k repeats of "x" allocated ~400 MB). Joining is linear.
func TestRepeatedHeadersJoinInLinearMemory(t *testing.T) {
	const n = 20000
	hs := make([]*corev3.HeaderValue, 0, n+2)
	hs = append(hs, &corev3.HeaderValue{Key: ":path", Value: "/v1/completions"})
	for range n {
		hs = append(hs, &corev3.HeaderValue{Key: "X-Dup", Value: "x"})
	}
	hs = append(hs, &corev3.HeaderValue{Key: "raw", RawValue: []byte("r")})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got := joinHeaders(hs)
	runtime.ReadMemStats(&after)
	if want := strings.TrimSuffix(strings.Repeat("x,", n), ","); got["x-dup"] != want || got[":path"] != "/v1/completions" || got["raw"] != "r" {
		t.Fatalf("joined headers wrong: %d keys, x-dup of %d bytes", len(got), len(got["x-dup"]))
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Fatalf("joining %d repeats of one header allocated %d MiB; want linear (well under 8 MiB)", n, alloc>>20)
	}
}

// TestResponseMessageBeforeTheRouteIsAViolation: a response message before Tandem answered the
// request used to mark the stream finished, so the decision made afterwards never saw
// Lifecycle.Done (its in-flight counts leaked for good). It is now a protocol violation, and
// no decision is left open. (Found by FuzzServer: testdata/fuzz/FuzzServer/4d652f93b3c92d3b.)
func TestResponseMessageBeforeTheRouteIsAViolation(t *testing.T) {
	cases := []struct {
		name  string
		early func(s *envoy.Stream) error
	}{
		{"response trailers", func(s *envoy.Stream) error { return s.SendResponseTrailers(nil) }},
		{"response headers, end of stream", func(s *envoy.Stream) error { return s.SendResponseHeaders(200, nil, true, nil) }},
		{"response body, end of stream", func(s *envoy.Stream) error { return s.SendResponseBody([]byte("x"), true) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lcs := &lifecycles{}
			obs := &recObserver{closed: make(chan struct{}, 1)}
			c := serve(t, NewServer(twoPods(), lcs.scheduler("", config.DefaultPD()), Options{Observer: obs}))
			s, err := c.Open(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SendRequestHeaders(envoy.Headers(":method", "POST", ":path", "/v1/chat/completions"), false, nil); err != nil {
				t.Fatal(err)
			}
			if err := tc.early(s); err != nil {
				t.Fatal(err)
			}
			_ = s.SendRequestBody([]byte(chatBody), true) // may fail: the server may have ended the stream
			_, err = s.Recv()
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "before the request was answered") {
				t.Fatalf("got %v, want a FailedPrecondition protocol violation", err)
			}
			obs.waitClosed(t, 1)
			lcs.mu.Lock()
			defer lcs.mu.Unlock()
			for i, lc := range lcs.all {
				if _, dones, _ := lc.snapshot(); dones != 1 {
					t.Errorf("decision %d: Lifecycle.Done called %d times, want 1", i, dones)
				}
			}
		})
	}
}
