package handoff

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// legEnd waits for the hand-off's PrefillDone and returns what it was called with.
func (f *fixture) legEnd(t *testing.T) error {
	t.Helper()
	select {
	case err := <-f.legs:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("PrefillDone was not called")
		return nil
	}
}

// TestPrefillDoneFailsOnlyWhatFailsTheRequest: PrefillDone(err) releases the request's kv and
// decode token-load charges at once (pd's lifecycle), so it may receive a failure only when that
// failure ends the request. An SGLang prefill leg that answers 200 with an unreadable body, or
// that fails after the decode leg responded, does not end it: the decode leg runs on and its
// charges must hold (issue 11, defect 5: both used to release them early).
func TestPrefillDoneFailsOnlyWhatFailsTheRequest(t *testing.T) {
	t.Run("sglang 200 with an unreadable body", func(t *testing.T) {
		f := newFixture(t, config.DefaultPD())
		pod := newPrefillPod(t, answer(`not json`))
		h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineSGLang, nil, nil), request.APICompletions, `{"prompt":"p"}`)
		if _, aerr := h.Start(context.Background()); aerr != nil {
			t.Fatal(aerr)
		}
		if err := f.legEnd(t); err != nil {
			t.Errorf("PrefillDone(%v): the request goes on, its charges must hold", err)
		}
		<-h.PrefillSucceeded()
	})
	t.Run("sglang failure after the decode leg responded", func(t *testing.T) {
		f := newFixture(t, config.DefaultPD())
		release := make(chan struct{})
		pod := newPrefillPod(t, func(w http.ResponseWriter, r *http.Request) { <-release; fail(500)(w, r) })
		h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineSGLang, nil, nil), request.APICompletions, `{"prompt":"p"}`)
		if _, aerr := h.Start(context.Background()); aerr != nil {
			t.Fatal(aerr)
		}
		<-pod.bodies
		h.DecodeResponded()
		close(release)
		if err := f.legEnd(t); err != nil {
			t.Errorf("PrefillDone(%v): the decode leg is answering, its charges must hold", err)
		}
		f.ev.expect(t, `prefill sglang "http_status" after_response`)
	})
	t.Run("sglang failure before the decode leg responded", func(t *testing.T) {
		pd := config.DefaultPD()
		pd.DecodeAbortTimeout = 0 // no abort: this case is about the charges
		f := newFixture(t, pd)
		pod := newPrefillPod(t, fail(503))
		h := f.handoff(t, serverEndpoint(t, pod.Server, "p0", pool.EngineSGLang, nil, nil), request.APICompletions, `{"prompt":"p"}`)
		if _, aerr := h.Start(context.Background()); aerr != nil {
			t.Fatal(aerr)
		}
		if err := f.legEnd(t); err == nil {
			t.Error("PrefillDone(nil) for a failure that fails the request")
		}
		<-h.Failed()
	})
	t.Run("generation_first failure after the response", func(t *testing.T) {
		pd := config.DefaultPD()
		pd.TRTScheduleStyle = ScheduleGenerationFirst
		f := newFixture(t, pd)
		mux := http.NewServeMux()
		mux.Handle("/server_info", serverInfoServer(t, `{"disaggregated_params":{"ctx_info_endpoint":"tcp://h:1","ctx_dp_rank":0}}`).Config.Handler)
		mux.HandleFunc("/", fail(500))
		srv := httptest.NewServer(mux)
		defer srv.Close()
		h := f.handoff(t, serverEndpoint(t, srv, "ctx-0", pool.EngineTRTLLM, nil, nil), request.APIChatCompletions, `{"messages":[]}`)
		h.DecodeResponded()
		if _, aerr := h.Start(context.Background()); aerr != nil {
			t.Fatal(aerr)
		}
		if err := f.legEnd(t); err == nil {
			t.Error("PrefillDone(nil) for a failure that ends the request (TensorRT-LLM resets the stream)")
		}
		<-h.Failed()
	})
}

// TestAPanicInTheAsyncPrefillLegFailsThatRequestOnly: the async prefill leg runs on a goroutine
// of its own, where a panic (here in the decision's PrefillDone, as a buggy ledger would) used
// to end the process. It is recovered: counted, the request fails with a 500 on Failed, and
// PrefillDone is not called again.
func TestAPanicInTheAsyncPrefillLegFailsThatRequestOnly(t *testing.T) {
	f := newFixture(t, config.DefaultPD())
	pod := newPrefillPod(t, answer(`{}`))
	calls := 0
	h, err := f.a.New(context.Background(), Input{PD: f.pd,
		Leg: Leg{RequestID: "r", Path: "/v1/completions", API: request.APICompletions, Body: []byte(`{"prompt":"p"}`),
			Prefill: serverEndpoint(t, pod.Server, "p0", pool.EngineSGLang, nil, nil), Decode: f.decode},
		PrefillDone: func(error) { calls++; panic("ledger bug") }})
	if err != nil {
		t.Fatal(err)
	}
	if _, aerr := h.Start(context.Background()); aerr != nil {
		t.Fatal(aerr)
	}
	select {
	case e := <-h.Failed():
		if e.Status != 500 || e.Reason != "internal_panic" {
			t.Errorf("failure %+v, want the 500 of a recovered panic", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no failure delivered")
	}
	f.ev.expect(t, "panic handoff_prefill")
	h.Done()
	waitBackground(t, h)
	if calls != 1 {
		t.Errorf("PrefillDone called %d times, want 1", calls)
	}
}
