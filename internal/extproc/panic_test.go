package extproc

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// panicLifecycle panics in the response event named by at.
type panicLifecycle struct {
	recLifecycle
	at string
}

func (l *panicLifecycle) ResponseHeaders(status int, served *pool.Endpoint) {
	l.recLifecycle.ResponseHeaders(status, served)
	if l.at == "headers" {
		panic("lifecycle bug in ResponseHeaders")
	}
}

func (l *panicLifecycle) ResponseBody(size int, eos bool) {
	l.recLifecycle.ResponseBody(size, eos)
	if l.at == "body" {
		panic("lifecycle bug in ResponseBody")
	}
}

// TestAPanicFailsOneRequestNotTheProcess: a panic while handling a stream (in the scheduler,
// or in a lifecycle while the response flows) ends that request only. Before the client has a
// response status it gets a 500 ImmediateResponse with an OpenAI-style body and
// x-error-routing: true; once the response has started the stream is reset. The panic is
// counted, the lifecycle still ends exactly once, and the next request on the same server is
// routed. (Without recovery a panic in any gRPC handler ends the whole process.)
func TestAPanicFailsOneRequestNotTheProcess(t *testing.T) {
	req := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)}
	t.Run("in the scheduler", func(t *testing.T) {
		calls := 0
		sched := &stubScheduler{decide: func(_ *request.Request, cands []*pool.Endpoint) (*picker.Decision, error) {
			if calls++; calls == 1 {
				var d *picker.Decision
				_ = d.Destination[0] // a nil dereference, as a buggy strategy would
			}
			return &picker.Decision{Strategy: "stub", Outcome: picker.OutcomeSingle, Destination: cands[:1]}, nil
		}}
		obs := newRecObserver()
		c := serve(t, NewServer(twoPods(), sched, Options{Observer: obs}))
		_, r, err := c.Route(testCtx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		im := r.Immediate
		if im == nil || im.Status != 500 || im.Headers[apierror.HeaderRouting] != "true" || im.Details != "tandem_"+apierror.ReasonPanic {
			t.Fatalf("answer %+v, want a 500 ImmediateResponse with %s: true", im, apierror.HeaderRouting)
		}
		if gjson.GetBytes(im.Body, "error.type").Str != "internal_error" || gjson.GetBytes(im.Body, "error.message").Str == "" {
			t.Errorf("body %s, want an OpenAI-style error", im.Body)
		}
		obs.waitClosed(t, 1)
		_, r, err = c.Route(testCtx(t), req)
		if err != nil || r.Immediate != nil || len(r.Endpoints()) == 0 {
			t.Fatalf("the next request: %v %+v", err, r)
		}
		obs.mu.Lock()
		defer obs.mu.Unlock()
		if !slices.Equal(obs.panics, []string{"extproc_stream"}) || !slices.Contains(obs.failed, "500 "+apierror.ReasonPanic) {
			t.Errorf("panics %q failed %q", obs.panics, obs.failed)
		}
	})
	for _, at := range []string{"headers", "body"} {
		t.Run("in the lifecycle, response "+at, func(t *testing.T) {
			lc := &panicLifecycle{at: at}
			obs := newRecObserver()
			c := serve(t, NewServer(twoPods(), firstWith(lc, nil), Options{Observer: obs}))
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			s, r, err := c.Route(ctx, req)
			if err != nil || r.Immediate != nil {
				t.Fatalf("route: %v %+v", err, r)
			}
			if err := s.SendResponseHeaders(200, nil, false, nil); err != nil {
				t.Fatal(err)
			}
			msg, err := s.Recv()
			if at == "headers" {
				// No status reached the client yet: it gets the 500.
				if err != nil || msg.GetImmediateResponse().GetStatus().GetCode() != 500 {
					t.Fatalf("got %v %v, want a 500 ImmediateResponse", msg, err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				_ = s.SendResponseBody([]byte("data: x\n\n"), false)
				for err == nil {
					_, err = s.Recv() // the chunk is handed back before the lifecycle hears of it
				}
				if status.Code(err) != codes.Internal {
					t.Fatalf("got %v, want the stream reset (Internal) once the response had started", err)
				}
			}
			obs.waitClosed(t, 1)
			if _, dones, derr := lc.snapshot(); dones != 1 || derr == nil || !strings.Contains(derr.Error(), apierror.ReasonPanic) {
				t.Errorf("Done called %d times with %v, want once with the panic's error", dones, derr)
			}
			obs.mu.Lock()
			defer obs.mu.Unlock()
			if len(obs.panics) != 1 {
				t.Errorf("panics counted: %q", obs.panics)
			}
		})
	}
}
