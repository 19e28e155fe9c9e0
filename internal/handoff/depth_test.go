package handoff

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
