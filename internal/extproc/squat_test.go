package extproc

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/conformance/envoy"
)

// Streams that send nothing cannot hold the admission slots: with MaxStreams 256, 256 real
// ext_proc streams that never send their request headers fill every slot, a fresh request is
// refused 429 at first, and is routed once the header deadline ended the silent streams
// (measured: the deadline plus the time to end 256 streams). The silent streams end with
// DeadlineExceeded.
func TestSilentStreamsCannotHoldEverySlot(t *testing.T) {
	const slots, deadline = 256, 500 * time.Millisecond
	srv := NewServer(twoPods(), nil, Options{Limits: Limits{MaxStreams: slots, RequestHeadersTimeout: deadline}})
	c, admitted := serveAdmitted(t, srv)
	ctx := testCtx(t)
	silent := make([]*envoy.Stream, slots)
	for i := range silent {
		s, err := c.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		silent[i] = s
	}
	admitted.wait(t, slots) // every silent stream holds a slot
	start := time.Now()
	route := func() *envoy.Routed {
		t.Helper()
		_, r, err := c.Route(ctx, envoy.Request{Method: "GET", Path: "/", NoBody: true}) // no body: a refusal cannot race its sending
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := route(); r.Immediate == nil || r.Immediate.Status != 429 {
		t.Fatalf("while %d silent streams hold every slot: %+v, want a 429", slots, r)
	}
	// A silent stream's end reaches the client once its handler returned, its slot given back.
	for i, s := range silent {
		if _, err := s.Recv(); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("silent stream %d ended with %v, want DeadlineExceeded", i, err)
		}
	}
	if r := route(); r.Immediate != nil {
		t.Fatalf("after the header deadline ended every silent stream: answered %d, want a route", r.Immediate.Status)
	}
	t.Logf("routed %v after %d silent streams filled --max-streams %d (header deadline %v)", time.Since(start), slots, slots, deadline)
}

// The header deadline's default is 10 s, and a negative one disables it.
func TestRequestHeadersTimeoutDefault(t *testing.T) {
	if got := (Limits{}).withDefaults().RequestHeadersTimeout; got != 10*time.Second {
		t.Errorf("default header deadline %v, want 10s", got)
	}
	if got := (Limits{RequestHeadersTimeout: -1}).withDefaults().RequestHeadersTimeout; got >= 0 {
		t.Errorf("a negative header deadline became %v", got)
	}
}
