package handoff

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// deepBody is a body-limit's worth of "[": gjson's recursive validation of it overflows the
// goroutine stack, a fatal error that ends the process rather than a panic.
var deepBody = bytes.Repeat([]byte("["), 10<<20)

// TestDeeplyNestedClientBodyIsRefused: the body check every adapter runs refuses a body nested
// beyond request.MaxJSONDepth with a 400 instead of crashing. Such a body reaches the hand-off
// when its route is not an inference API (request.Parse then routes it unread).
func TestDeeplyNestedClientBodyIsRefused(t *testing.T) {
	for _, body := range [][]byte{deepBody, []byte(`{"model":"m","x":` + strings.Repeat("[", request.MaxJSONDepth) + strings.Repeat("]", request.MaxJSONDepth) + `}`)} {
		e := checkControlled(body, vllmKeys)
		if e == nil || e.Status != http.StatusBadRequest || !strings.Contains(e.Message, "deep") {
			t.Fatalf("body of %d bytes: %v, want a 400 naming the depth", len(body), e)
		}
	}
	if e := checkControlled([]byte(`{"model":"m","x":[[1]]}`), vllmKeys); e != nil {
		t.Fatalf("shallow body refused: %v", e)
	}
}

// TestDeeplyNestedPrefillResponseIsABadResponse: a prefill pod answering 200 with a deeply
// nested body fails the leg as bad_response instead of crashing Tandem.
func TestDeeplyNestedPrefillResponseIsABadResponse(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(deepBody)
	}))
	defer srv.Close()
	x := NewExecutor(0)
	defer x.Close()
	target := serverEndpoint(t, srv, "prefill-0", pool.EngineVLLM, nil, nil)
	body, f := x.Do(context.Background(), Call{Target: target, Path: "/v1/completions", Body: []byte(`{}`)})
	if f == nil || f.Class != ClassBadResponse || !strings.Contains(f.Error(), "deep") {
		t.Fatalf("got %d bytes, failure %v; want bad_response naming the depth", len(body), f)
	}
}

// FuzzPrepare: every engine's Prepare takes any client body without panicking; it either
// refuses it with a 4xx/5xx *apierror.Error or returns prefill and decode bodies that are
// valid JSON objects, leaving the client's body untouched.
func FuzzPrepare(f *testing.F) {
	for _, b := range []string{
		`{"model":"m","prompt":"hi","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"kv_transfer_params":{"a":1}}`,
		`{"model":"m","stream":true,"stream":false}`,
		`{"model":"m","prompt":[1,2,3],"disaggregated_params":{"x":1}}`,
		`[1,2]`, `{"a":`, ``, `{"max_tokens":"x\u0000"}`,
	} {
		f.Add(b, "/v1/completions")
	}
	a, err := NewAdapters(config.DefaultPD(), Options{})
	if err != nil {
		f.Fatal(err)
	}
	engines := []string{pool.EngineVLLM, pool.EngineSGLang, pool.EngineTRTLLM}
	f.Fuzz(func(t *testing.T, body, path string) {
		for _, eng := range engines {
			in := Input{Leg: Leg{RequestID: "r", Path: path, API: request.APIFromPath(path), Body: []byte(body),
				Prefill: endpoint("p", "10.0.0.1", 8000, eng, nil, nil), Decode: endpoint("d", "10.0.0.2", 8000, eng, nil, nil)},
				PD: config.DefaultPD()}
			h, err := a.New(context.Background(), in)
			if string(in.Body) != body {
				t.Fatalf("%s changed the client's body", eng)
			}
			if err != nil {
				if ae := asAPIError(t, err); ae.Status < 400 || ae.Status > 599 {
					t.Fatalf("%s: status %d", eng, ae.Status)
				}
				continue
			}
			for what, b := range map[string][]byte{"prefill": h.plan.PrefillBody, "decode": h.plan.DecodeBody} {
				if !json.Valid(b) || !gjson.ParseBytes(b).IsObject() {
					t.Fatalf("%s %s body is not a JSON object: %q (client body %q)", eng, what, b, body)
				}
			}
		}
	})
}
