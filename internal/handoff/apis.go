package handoff

import (
	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// Which API each engine's hand-off carries. An engine disaggregates an API only when its
// server for that path reads the hand-off fields and answers them:
//   - vLLM reads and returns kv_transfer_params on /v1/chat/completions, /v1/completions,
//     /v1/messages (its Anthropic server) and /v1/responses. AIBrix's nixl contract (the whole
//     prefill answer as disagg_prefill_resp) is defined for chat and completions only.
//   - SGLang reads bootstrap_host, bootstrap_port and bootstrap_room on chat and completions.
//     Its /v1/messages builds a new chat request from the Anthropic fields alone, so a decode
//     leg would lose them and never receive the prompt's KV.
//   - TensorRT-LLM reads disaggregated_params on chat and completions only.
//
// Any other combination is refused with a 400 that says why and what to send instead: a
// silent route to one pod would not be the prefill/decode split the profile asks for.
func supports(eng Engine, api request.API) bool {
	switch api {
	case request.APIChatCompletions, request.APICompletions, "":
		return true
	case request.APIMessages, request.APIResponses:
		v, ok := eng.(*VLLM)
		return ok && v.Connector == ConnectorSHFS
	}
	return false
}

// refuseAPI is the 400 for an API the engine's hand-off does not carry.
func refuseAPI(eng Engine, api request.API) *apierror.Error {
	return apierror.BadRequest("pd_api_unsupported", "",
		"the %s API cannot be split into prefill and decode on %s pods (their server for %s does not carry the hand-off fields); send it to %s, or use a profile whose routing strategy is not pd",
		api, eng.Name(), request.PathFor(api), request.PathFor(request.APIChatCompletions))
}

// checkAPI refuses what an API's hand-off cannot do. A Responses request that continues a stored
// response (previous_response_id) needs the response store of the pod that answered it; a
// prefill pod has none, and would fail the prefill leg.
func checkAPI(api request.API, body []byte) *apierror.Error {
	if api != request.APIResponses {
		return nil
	}
	if v := gjson.GetBytes(body, "previous_response_id"); v.Exists() && v.Type != gjson.Null {
		return apierror.BadRequest("pd_previous_response", "previous_response_id",
			"a responses request with \"previous_response_id\" cannot be split into prefill and decode: the prefill pod has no stored response to continue; send the conversation in \"input\", or use a profile whose routing strategy is not pd")
	}
	return nil
}

// prefillOnlyFor turns a body of the API into a one-token, non-streaming prefill leg: chat and
// completions as prefillOnly does; Messages set max_tokens; Responses set max_output_tokens
// and are neither stored nor run in the background (the prefill's answer is read, not kept).
func (e *edit) prefillOnlyFor(api request.API, keepMaxCompletionTokens bool) *edit {
	switch api {
	case request.APIMessages:
		return e.raw(wire.FieldMaxTokens, []byte("1")).raw(wire.FieldStream, []byte("false"))
	case request.APIResponses:
		return e.raw(wire.FieldMaxOutputTokens, []byte("1")).raw(wire.FieldStream, []byte("false")).
			raw(wire.FieldStore, []byte("false")).raw(wire.FieldBackground, []byte("false"))
	}
	return e.prefillOnly(keepMaxCompletionTokens)
}
