package extproc

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// pdPair routes as a PD decision: the second candidate decodes, the first prefills.
func pdPair(lc picker.Lifecycle, mode string) *stubScheduler {
	return firstWith(lc, func(d *picker.Decision) {
		d.Outcome = picker.OutcomePD
		d.Prefill = d.Destination[:1]
		d.Destination = d.Destination[1:]
		d.Handoff, d.PD = mode, config.DefaultPD()
		d.SetHeaders = map[string]string{wire.HeaderPrefillerHostPort: d.Prefill[0].HostPort()}
	})
}

// TestSidecarHandoffNamesThePrefillTargetInHeaderAndMetadata: the sidecar hand-off sets
// x-prefiller-host-port and the same value in the envoy.lb dynamic metadata.
func TestSidecarHandoffNamesThePrefillTargetInHeaderAndMetadata(t *testing.T) {
	for _, mode := range []string{config.HandoffSidecar, ""} {
		c := serve(t, NewServer(twoPods(), pdPair(&recLifecycle{}, mode), Options{}))
		s, err := c.Open(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SendRequest(envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)}); err != nil {
			t.Fatal(err)
		}
		msg, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		set := map[string]string{}
		for _, h := range msg.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			set[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
		}
		lb := msg.GetDynamicMetadata().GetFields()[wire.MetadataNamespaceLB].GetStructValue().GetFields()
		if set[wire.HeaderPrefillerHostPort] != "10.0.0.1:8000" || lb[wire.MetadataKeyPrefiller].GetStringValue() != "10.0.0.1:8000" ||
			lb[wire.MetadataKeyDestination].GetStringValue() != "10.0.0.2:8000" {
			t.Errorf("mode %q: headers %v, envoy.lb metadata %v", mode, set, lb)
		}
	}
}

// TestEPPHandoffRefusedBeforeAnythingIsSent: an epp decision that cannot run its hand-off is a
// 503 naming the problem, and the decision's lifecycle ends once.
func TestEPPHandoffRefusedBeforeAnythingIsSent(t *testing.T) {
	adapters, err := handoff.NewAdapters(config.DefaultPD(), handoff.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer adapters.Close()
	mixed := pool.NewStore()
	mixed.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{
		pool.NewEndpoint("ns", "a", "10.0.0.1", 8000, 0, map[string]string{pool.LabelEngine: "vllm"}, nil),
		pool.NewEndpoint("ns", "b", "10.0.0.2", 8000, 0, map[string]string{pool.LabelEngine: "sglang"}, nil),
	}, true)
	cases := []struct {
		name     string
		store    *pool.Store
		adapters *handoff.Adapters
		reason   string
	}{
		{"no hand-off configured", twoPods(), nil, "pd_handoff_unavailable"},
		{"pods of the model disagree on the engine", mixed, adapters, "engine_mismatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lc := &recLifecycle{}
			c := serve(t, NewServer(tc.store, pdPair(lc, config.HandoffEPP), Options{Handoff: tc.adapters}))
			s, r, err := c.Route(testCtx(t), envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)})
			if err != nil {
				t.Fatal(err)
			}
			if r.Immediate == nil || r.Immediate.Status != 503 || r.Immediate.Details != "tandem_"+tc.reason {
				t.Fatalf("answer %+v, want a 503 with reason %s", r.Immediate, tc.reason)
			}
			if msg := gjson.GetBytes(r.Immediate.Body, "error.message").Str; msg == "" {
				t.Errorf("no error message: %s", r.Immediate.Body)
			}
			_ = s.CloseSend()
			_, _ = s.Recv()
			if _, dones, err := lc.snapshot(); dones != 1 || err == nil {
				t.Errorf("lifecycle Done called %d times with %v, want once with the error", dones, err)
			}
		})
	}
}

// TestGenerationFirstPrefillFailureAfterTheResponseStartedResetsTheStream: with TensorRT-LLM
// generation_first the context leg runs beside the generation leg; when it fails after the
// client already has the status and a first chunk, the stream is reset (a gRPC error), which
// the gateway turns into a cut response, and the lifecycle ends with the failure.
func TestGenerationFirstPrefillFailureAfterTheResponseStartedResetsTheStream(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	ctxWorker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/server_info" {
			_, _ = io.WriteString(w, `{"disaggregated_params":{"ctx_info_endpoint":"tcp://127.0.0.1:1","ctx_dp_rank":0}}`)
			return
		}
		arrived <- struct{}{}
		select {
		case <-release:
			http.Error(w, `{"error":"context worker failed"}`, http.StatusInternalServerError)
		case <-r.Context().Done():
		}
	}))
	defer ctxWorker.Close()
	pd := config.DefaultPD()
	pd.TRTScheduleStyle = handoff.ScheduleGenerationFirst
	adapters, err := handoff.NewAdapters(pd, handoff.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer adapters.Close()
	host, port, _ := net.SplitHostPort(ctxWorker.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	trt := map[string]string{pool.LabelEngine: pool.EngineTRTLLM}
	store := pool.NewStore()
	store.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{
		pool.NewEndpoint("ns", "ctx-0", host, int32(p), 0, trt, nil),
		pool.NewEndpoint("ns", "gen-0", "127.0.0.2", 8000, 0, trt, nil),
	}, true)
	lc := &recLifecycle{}
	c := serve(t, NewServer(store, pdPair(lc, config.HandoffEPP), Options{Handoff: adapters}))
	s, err := c.Open(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	req := envoy.Request{Method: "POST", Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"hi","stream":true}`)}
	if err := s.SendRequest(req); err != nil {
		t.Fatal(err)
	}
	r, err := s.ReadRoute(req)
	if err != nil || r.Immediate != nil {
		t.Fatalf("route: %v %+v", err, r.Immediate)
	}
	if dp := gjson.GetBytes(r.Body, "disaggregated_params"); dp.Get("request_type").Str != "generation_only" || dp.Get("schedule_style").Raw != "1" {
		t.Fatalf("decode body %s", r.Body)
	}
	if r.Headers.Set[wire.HeaderPrefillerHostPort] != "" {
		t.Errorf("epp route sets %s", wire.HeaderPrefillerHostPort)
	}
	<-arrived // the context leg is running
	if err := s.SendResponseHeaders(200, nil, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SendResponseBody([]byte("data: {}\n\n"), false); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // the held headers answer, then the chunk
		if _, err := s.Recv(); err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
	}
	close(release)
	if _, err := s.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("after the context leg failed: %v, want the stream reset (Unavailable)", err)
	}
	if _, dones, err := lc.snapshot(); dones != 1 || err == nil {
		t.Errorf("lifecycle Done called %d times with %v, want once with the failure", dones, err)
	}
}

// A pair that agrees on its engine is handed off whatever engine the model's other pods run: a
// standard pod of another engine serves whole requests and takes no part in the hand-off.
func TestStandardPodOfAnotherEngineDoesNotBlockThePair(t *testing.T) {
	adapters, err := handoff.NewAdapters(config.DefaultPD(), handoff.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer adapters.Close()
	engine := func(e string) map[string]string {
		return map[string]string{pool.LabelEngine: e, pool.LabelModelName: gjson.Get(chatBody, "model").Str}
	}
	store := pool.NewStore()
	// Ports nothing listens on: the prefill leg is refused at once, past the engine check.
	store.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{
		pool.NewEndpoint("ns", "a", "127.0.0.1", 1, 0, engine("vllm"), nil),
		pool.NewEndpoint("ns", "b", "127.0.0.1", 2, 0, engine("vllm"), nil),
		pool.NewEndpoint("ns", "c", "127.0.0.1", 3, 0, engine("sglang"), nil),
	}, true)
	c := serve(t, NewServer(store, pdPair(&recLifecycle{}, config.HandoffEPP), Options{Handoff: adapters}))
	s, r, err := c.Route(testCtx(t), envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Immediate == nil || r.Immediate.Details == "tandem_engine_mismatch" ||
		!strings.Contains(gjson.GetBytes(r.Immediate.Body, "error.message").Str, "prefill") {
		t.Fatalf("answer %+v: want the prefill leg tried (and refused), not an engine mismatch", r.Immediate)
	}
	_ = s.CloseSend()
	_, _ = s.Recv()
}

// prefillEnds is an outcome reader keeping each route's prefill-end event.
type prefillEnds struct {
	mu  sync.Mutex
	got []outcome.Route
}

func (p *prefillEnds) Observe(e *outcome.Event) {
	if e.Phase == outcome.PhasePrefillEnd {
		p.mu.Lock()
		p.got = append(p.got, e.Route)
		p.mu.Unlock()
	}
}

// TestSidecarAnswerTellsHowThePrefillLegEnded: in the sidecar hand-off the decode pod's answer
// ends the prefill leg in the server's outcome record (inferred, not observed); when the gateway
// served the request from a combined fallback, that pod ran the prompt itself, so the record
// says no leg ran, as the decision's own lifecycle says.
func TestSidecarAnswerTellsHowThePrefillLegEnded(t *testing.T) {
	store := pool.NewStore()
	store.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{
		pool.NewEndpoint("ns", "a", "10.0.0.1", 8000, 0, map[string]string{pool.LabelRoleName: "prefill"}, nil),
		pool.NewEndpoint("ns", "b", "10.0.0.2", 8000, 0, map[string]string{pool.LabelRoleName: "decode"}, nil),
		pool.NewEndpoint("ns", "c", "10.0.0.3", 8000, 0, nil, nil),
	}, true)
	eps := store.Load().Endpoints
	sched := &stubScheduler{decide: func(*request.Request, []*pool.Endpoint) (*picker.Decision, error) {
		return &picker.Decision{Strategy: "stub", Outcome: picker.OutcomePD, Step: "pair", Lifecycle: &recLifecycle{},
			Prefill: eps[:1], Destination: eps[1:], Handoff: config.HandoffSidecar, PD: config.DefaultPD(),
			SetHeaders: map[string]string{wire.HeaderPrefillerHostPort: eps[0].HostPort()}}, nil
	}}
	for _, tc := range []struct {
		served  *pool.Endpoint
		wantErr error
	}{{eps[1], nil}, {eps[2], outcome.ErrPrefillNotRun}} {
		t.Run(tc.served.Name, func(t *testing.T) {
			rec := outcome.NewRecorder(nil)
			ends := &prefillEnds{}
			rec.Subscribe(ends)
			obs := newRecObserver()
			c := serve(t, NewServer(store, sched, Options{Observer: obs, Outcomes: rec}))
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			chat := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)}
			s, routed, err := c.Route(ctx, chat)
			if err != nil || routed.Immediate != nil {
				t.Fatalf("route: %v %+v", err, routed)
			}
			if err := s.SendResponseHeaders(200, nil, false, envoy.Served(tc.served.HostPort())); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Recv(); err != nil {
				t.Fatal(err)
			}
			cancel()
			obs.waitClosed(t, 1)
			ends.mu.Lock()
			defer ends.mu.Unlock()
			if len(ends.got) != 1 {
				t.Fatalf("%d prefill-end events, want 1", len(ends.got))
			}
			r := ends.got[0]
			if r.PrefillObserved || !errors.Is(r.PrefillErr, tc.wantErr) || (tc.wantErr == nil && r.PrefillErr != nil) {
				t.Errorf("served by %s: prefill err %v observed %v, want %v inferred", tc.served.Key(), r.PrefillErr, r.PrefillObserved, tc.wantErr)
			}
		})
	}
}
