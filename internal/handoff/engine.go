package handoff

import (
	"context"
	"fmt"
	"net/http"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// Leg is one request's hand-off: the client's request and the pair the picker chose.
type Leg struct {
	// RequestID is the gateway request id (x-request-id); it prefixes SGLang's rid.
	RequestID string
	// Path is the client's :path; the prefill leg is sent to the same path on the prefill pod
	// (to the API's OpenAI path when the client sent none).
	Path string
	// API tells chat from completions (TensorRT-LLM writes prompt_token_ids differently).
	API request.API
	// Body is the client's body. Adapters never modify it.
	Body    []byte
	Prefill *pool.Endpoint
	Decode  *pool.Endpoint
}

// Plan is an engine adapter's answer for one leg.
type Plan struct {
	// PrefillBody is sent to the prefill pod.
	PrefillBody []byte
	// DecodeBody is forwarded to the decode pod: final for async plans, the body to use when
	// the prefill response carries nothing to merge for sync ones.
	DecodeBody []byte
	// Async plans send the prefill leg concurrently with the decode leg (SGLang, whose prefill
	// only returns once decode has connected, and TensorRT-LLM generation_first).
	Async bool
	// RID is the gateway-owned SGLang request id on both legs, "" for other engines. It is what
	// /abort_request matches.
	RID string
	// BadResponseFails says whether a 200 with an unusable body fails the request. For SGLang it
	// does not: by then the KV has moved and decode can answer.
	BadResponseFails bool
	// FailsAfterResponse says a prefill failure must still end the request once the decode leg
	// has responded (TensorRT-LLM generation_first: the engine may send SSE headers before the
	// KV arrives). For SGLang such a failure is only logged.
	FailsAfterResponse bool
}

// Engine is one engine's hand-off contract.
type Engine interface {
	// Name is the engine and variant, e.g. "vllm/shfs", "sglang", "trtllm/context_first".
	Name() string
	// Prepare builds both legs' bodies. Errors are *apierror.Error; nothing has been sent yet.
	Prepare(ctx context.Context, leg *Leg) (*Plan, error)
	// Merge builds the decode body from a sync plan's prefill response (a valid JSON document).
	// An error means the response cannot be used (failure class bad_response).
	Merge(leg *Leg, plan *Plan, prefillResp []byte) ([]byte, error)
}

// EngineOf returns the one engine all endpoints run (a missing label counts as vLLM), or a 503
// naming two pods that disagree: a hand-off cannot mix engines.
func EngineOf(endpoints []*pool.Endpoint) (string, error) {
	var first *pool.Endpoint
	for _, ep := range endpoints {
		if first == nil {
			first = ep
			continue
		}
		if ep.Engine != first.Engine {
			return "", apierror.Unavailable("engine_mismatch",
				"a prefill/decode pair must run one engine: %s has %s=%q, %s has %q; fix the %s labels",
				first.PodKey(), pool.LabelEngine, first.Engine, ep.PodKey(), ep.Engine, pool.LabelEngine)
		}
	}
	if first == nil {
		return "", apierror.Unavailable("no_endpoint", "no endpoint to read the engine from")
	}
	return first.Engine, nil
}

// badPod is the error for a pod whose labels or annotations make the hand-off impossible.
func badPod(ep *pool.Endpoint, format string, args ...any) *apierror.Error {
	return &apierror.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable",
		Message: fmt.Sprintf("pod %s: ", ep.PodKey()) + fmt.Sprintf(format, args...), Reason: "pd_bad_pod"}
}
