package extproc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// gatewayEnding is how a test gateway ends a stream early: a plain reset (RST_STREAM), or
// Envoy's order (ExternalProcessorStreamImpl::close(): END_STREAM, then RST_STREAM; grpc-go's
// writer sends the half-close's frame before the reset's).
type gatewayEnding struct {
	name string
	end  func(s *envoy.Stream, cancel context.CancelFunc)
}

var gatewayEndings = []gatewayEnding{
	{"reset", func(_ *envoy.Stream, cancel context.CancelFunc) { cancel() }},
	{"envoy order", func(s *envoy.Stream, cancel context.CancelFunc) { _ = s.CloseSend(); cancel() }},
}

// strictHealth is passive health that demotes and ejects on the first failure, so any failure
// counted against a pod shows.
func strictHealth(store *pool.Store, rec *outcome.Recorder) *health.Detector {
	cfg := config.DefaultOutlier()
	cfg.Consecutive5xx, cfg.ConsecutiveGatewayFailure, cfg.MaxEjectionPercent, cfg.RecentFailure = 1, 1, 100, time.Hour
	d := health.New(health.Options{Config: cfg, Store: store, Recorder: rec})
	rec.Subscribe(d)
	return d
}

func isCallerEnding(err error) bool {
	return errors.Is(err, context.Canceled) && errors.Is(err, ErrStreamEnded)
}

// TestStreamEndings: however the gateway ends a routed stream (plain reset or Envoy's order),
// a response complete by its content is a success, an ending before the response headers is
// the caller's, a response cut short is nobody's fault; only the pod's own failure (here the
// gateway's 503 local reply for it, the control) is counted against it.
func TestStreamEndings(t *testing.T) {
	chat := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)}
	sse := envoy.Headers("content-type", "text/event-stream")
	respond := func(status int, hs []envoy.Header, chunks ...string) func(*testing.T, *envoy.Stream) {
		return func(t *testing.T, s *envoy.Stream) {
			t.Helper()
			if err := s.SendResponseHeaders(status, hs, false, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Recv(); err != nil {
				t.Fatal(err)
			}
			for _, c := range chunks {
				if err := s.SendResponseBody([]byte(c), false); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Recv(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	event := `data: {"choices":[{"delta":{"content":"hi"}}]}` + "\n\n"
	cases := []struct {
		name     string
		before   func(*testing.T, *envoy.Stream)
		wantDone func(error) bool
		fails    bool // health counts a failure against the destination
	}{
		{"after routing, before the response headers", nil, isCallerEnding, false},
		{"mid-response", respond(200, sse, event),
			func(err error) bool { return err != nil && !errors.Is(err, context.Canceled) }, false},
		{"right after data: [DONE]", respond(200, sse, event, "data: [DONE]\n\n"),
			func(err error) bool { return err == nil }, false},
		{"after data:[DONE] split between two chunks", respond(200, sse, event+"data:[DO", "NE]\n\n"),
			func(err error) bool { return err == nil }, false},
		{"[DONE] inside an event's text is not the end", respond(200, sse, `data: {"text":"data: [DONE]"}`+"\n\n"),
			func(err error) bool { return err != nil }, false},
		{"after the whole content-length body", respond(200, envoy.Headers("content-length", "8"), "{\"a\":", "1}\n"),
			func(err error) bool { return err == nil }, false},
		{"control: the gateway's 503 local reply, then the client leaves", respond(503, envoy.Headers("content-length", "200"), "upstream connect error"),
			func(err error) bool { return err != nil }, true},
	}
	for _, ending := range gatewayEndings {
		for _, tc := range cases {
			t.Run(ending.name+"/"+tc.name, func(t *testing.T) {
				store := twoPods()
				rec := outcome.NewRecorder(nil)
				hd := strictHealth(store, rec)
				lc := &recLifecycle{}
				obs := newRecObserver()
				c := serve(t, NewServer(store, firstWith(lc, nil), Options{Observer: obs, Outcomes: rec, Health: hd}))
				ctx, cancel := context.WithCancel(testCtx(t))
				defer cancel()
				s, routed, err := c.Route(ctx, chat)
				if err != nil || routed.Immediate != nil {
					t.Fatalf("route: %v %+v", err, routed)
				}
				if tc.before != nil {
					tc.before(t, s)
				}
				ending.end(s, cancel)
				obs.waitClosed(t, 1)
				_, dones, derr := lc.snapshot()
				if dones != 1 || !tc.wantDone(derr) {
					t.Errorf("Done called %d times with %v", dones, derr)
				}
				st := hd.Status(store.Load().Endpoints[0].Key())
				counted := st.Ejected || st.RecentFailure || st.Consecutive5xx > 0 || st.ConsGateway > 0
				if counted != tc.fails {
					t.Errorf("health of the destination %+v; a failure counted: %v, want %v", st, counted, tc.fails)
				}
			})
		}
	}
}

// TestEndingDuringTheBody: a client that goes away while sending its request body gets
// nothing decided: no pick, no lifecycle, no failure counted, and the stream ends. (Envoy opens
// the ext_proc stream to send the request headers, so no ending comes before them.)
func TestEndingDuringTheBody(t *testing.T) {
	for _, ending := range gatewayEndings {
		t.Run(ending.name, func(t *testing.T) {
			lc := &recLifecycle{}
			sched := firstWith(lc, nil)
			obs := newRecObserver()
			c := serve(t, NewServer(twoPods(), sched, Options{Observer: obs}))
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			s, err := c.Open(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SendRequestHeaders(envoy.Headers(":method", "POST", ":path", "/v1/chat/completions"), false, nil); err != nil {
				t.Fatal(err)
			}
			if err := s.SendRequestBody([]byte(chatBody[:20]), false); err != nil {
				t.Fatal(err)
			}
			ending.end(s, cancel)
			obs.waitClosed(t, 1)
			sched.mu.Lock()
			picks := len(sched.reqs)
			sched.mu.Unlock()
			obs.mu.Lock()
			failed := len(obs.failed)
			obs.mu.Unlock()
			if _, dones, _ := lc.snapshot(); picks != 0 || dones != 0 || failed != 0 {
				t.Errorf("%d picks, %d lifecycles ended, %d failures counted; want none", picks, dones, failed)
			}
		})
	}
}
