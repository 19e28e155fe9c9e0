package handoff

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/handoff/trt"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// TensorRT-LLM schedule styles (AIBRIX_TRT_SCHEDULE_STYLE).
const (
	ScheduleContextFirst    = "context_first"
	ScheduleGenerationFirst = "generation_first"
)

var trtKeys = append([]string{wire.FieldDisaggregatedParams, wire.FieldPromptTokenIDs, wire.FieldPrompt}, prefillKeys...)

// TRTContextFirst is the default TensorRT-LLM adapter: a context-only leg first, whose returned
// disaggregated_params (and prompt_token_ids) the generation leg carries. 64-bit ids are copied
// as raw JSON and never pass through a float.
type TRTContextFirst struct {
	IDs *trt.IDs
}

// Name implements Engine.
func (t *TRTContextFirst) Name() string { return "trtllm/" + ScheduleContextFirst }

// Prepare implements Engine.
func (t *TRTContextFirst) Prepare(_ context.Context, leg *Leg) (*Plan, error) {
	if err := checkControlled(leg.Body, trtKeys); err != nil {
		return nil, err
	}
	params := fmt.Appendf(nil, `{"request_type":"context_only","disagg_request_id":%d}`, t.IDs.Next())
	prefill, err := newEdit(leg.Body).raw(wire.FieldDisaggregatedParams, params).prefillOnly(false).done()
	if err != nil {
		return nil, fmt.Errorf("building the TensorRT-LLM context body: %w", err)
	}
	return &Plan{PrefillBody: prefill, DecodeBody: leg.Body, BadResponseFails: true}, nil
}

// Merge implements Engine. disaggregated_params is read from the top level, else from
// choices[0]; prompt_token_ids likewise. Completions receive the ids as "prompt", chat as
// "prompt_token_ids", so the generation leg does not tokenise again.
func (t *TRTContextFirst) Merge(leg *Leg, _ *Plan, resp []byte) ([]byte, error) {
	dp, ok := firstObject(resp, wire.FieldDisaggregatedParams, "choices.0."+wire.FieldDisaggregatedParams)
	if !ok {
		return nil, errors.New("the context response has no disaggregated_params object (top level or choices[0])")
	}
	params, err := sjson.SetBytes([]byte(dp.Raw), wire.FieldRequestType, "generation_only")
	if err != nil {
		return nil, fmt.Errorf("setting disaggregated_params.request_type: %w", err)
	}
	e := newEdit(leg.Body).raw(wire.FieldDisaggregatedParams, params)
	for _, p := range []string{wire.FieldPromptTokenIDs, "choices.0." + wire.FieldPromptTokenIDs} {
		ids := gjson.GetBytes(resp, p)
		if !ids.IsArray() {
			continue
		}
		key := wire.FieldPromptTokenIDs
		if leg.API == request.APICompletions {
			key = wire.FieldPrompt
		}
		e.raw(key, []byte(ids.Raw))
		break
	}
	return e.done()
}

// TRTGenerationFirst sends both legs at once: the context worker's /server_info metadata and one
// shared id go on both, schedule_style 1 tells the workers which goes first. Missing or invalid
// metadata fails the request before either leg is sent.
type TRTGenerationFirst struct {
	IDs        *trt.IDs
	ServerInfo *trt.ServerInfoCache
}

// scheduleStyleGenerationFirst is TensorRT-LLM's value for generation_first.
const scheduleStyleGenerationFirst = 1

// Name implements Engine.
func (t *TRTGenerationFirst) Name() string { return "trtllm/" + ScheduleGenerationFirst }

// Prepare implements Engine.
func (t *TRTGenerationFirst) Prepare(ctx context.Context, leg *Leg) (*Plan, error) {
	if err := checkControlled(leg.Body, trtKeys); err != nil {
		return nil, err
	}
	md, err := t.ServerInfo.Lookup(ctx, leg.Prefill)
	if err != nil {
		return nil, apierror.Unavailable("trt_server_info", "TensorRT-LLM generation_first: %v", err)
	}
	id := strconv.FormatInt(t.IDs.Next(), 10)
	ctxParams := fmt.Appendf(nil, `{"request_type":"context_only","disagg_request_id":%s,"schedule_style":%d}`,
		id, scheduleStyleGenerationFirst)
	var gen bytes.Buffer
	fmt.Fprintf(&gen, `{"request_type":"generation_only","disagg_request_id":%s,"ctx_request_id":%s,"ctx_info_endpoint":%s,"ctx_dp_rank":%s`,
		id, id, md.CtxInfoEndpoint, md.CtxDPRank)
	if md.EncodedOpaqueState != nil {
		fmt.Fprintf(&gen, `,"encoded_opaque_state":%s`, md.EncodedOpaqueState)
	}
	fmt.Fprintf(&gen, `,"schedule_style":%d}`, scheduleStyleGenerationFirst)

	prefill, err := newEdit(leg.Body).raw(wire.FieldDisaggregatedParams, ctxParams).prefillOnly(false).done()
	if err != nil {
		return nil, fmt.Errorf("building the TensorRT-LLM context body: %w", err)
	}
	decode, err := newEdit(leg.Body).raw(wire.FieldDisaggregatedParams, gen.Bytes()).done()
	if err != nil {
		return nil, fmt.Errorf("building the TensorRT-LLM generation body: %w", err)
	}
	return &Plan{PrefillBody: prefill, DecodeBody: decode, Async: true,
		BadResponseFails: true, FailsAfterResponse: true}, nil
}

// Merge implements Engine: a late context response never changes the generation body.
func (t *TRTGenerationFirst) Merge(_ *Leg, plan *Plan, _ []byte) ([]byte, error) {
	return plan.DecodeBody, nil
}
