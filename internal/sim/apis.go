package sim

import (
	"fmt"
	"net/http"
	"strings"
)

// readMessages tokenizes an Anthropic Messages body: the system prompt (a string or text
// blocks), then each message's role and text, as vLLM's chat template would see them.
func (q *inferReq) readMessages() *httpError {
	var sb strings.Builder
	switch sys := q.raw["system"].(type) {
	case nil:
	case string:
		sb.WriteString("system\n" + sys + "\n")
	case []any:
		sb.WriteString("system\n" + blockText(sys) + "\n")
	default:
		return badRequest("system", "\"system\" must be a string or a list of content blocks, got %s", describe(sys))
	}
	msgs, ok := q.raw["messages"].([]any)
	if !ok || len(msgs) == 0 {
		return badRequest("messages", "\"messages\" must be a non-empty array, got %s", describe(q.raw["messages"]))
	}
	for i, m := range msgs {
		obj, ok := m.(map[string]any)
		role, _ := obj["role"].(string)
		if !ok || (role != "user" && role != "assistant") {
			return badRequest("messages", "messages[%d].role must be \"user\" or \"assistant\"", i)
		}
		sb.WriteString(role + "\n")
		switch c := obj["content"].(type) {
		case string:
			sb.WriteString(c)
		case []any:
			sb.WriteString(blockText(c))
		default:
			return badRequest("messages", "messages[%d].content must be a string or a list of content blocks, got %s", i, describe(c))
		}
		sb.WriteByte('\n')
	}
	q.ids = Tokenize(sb.String())
	return nil
}

// readResponses tokenizes an OpenAI Responses body: the instructions, then the input (a
// string, or items whose content is a string or parts with text).
func (q *inferReq) readResponses() *httpError {
	var sb strings.Builder
	if ins, ok := q.raw["instructions"].(string); ok {
		sb.WriteString(ins + "\n")
	}
	switch in := q.raw["input"].(type) {
	case string:
		sb.WriteString(in)
	case []any:
		if len(in) == 0 {
			return badRequest("input", "\"input\" is empty")
		}
		for i, item := range in {
			obj, ok := item.(map[string]any)
			if !ok {
				return badRequest("input", "input[%d] must be an object, got %s", i, describe(item))
			}
			if role, ok := obj["role"].(string); ok {
				sb.WriteString(role + "\n")
			}
			switch c := obj["content"].(type) {
			case string:
				sb.WriteString(c)
			case []any:
				sb.WriteString(blockText(c))
			}
			sb.WriteByte('\n')
		}
	default:
		return badRequest("input", "\"input\" must be a string or a list of input items, got %s", describe(q.raw["input"]))
	}
	q.ids = Tokenize(sb.String())
	if len(q.ids) == 0 {
		return badRequest("input", "\"input\" is empty")
	}
	return nil
}

func blockText(blocks []any) string {
	var sb strings.Builder
	for _, b := range blocks {
		if obj, ok := b.(map[string]any); ok {
			t, _ := obj["text"].(string)
			sb.WriteString(t)
		}
	}
	return sb.String()
}

// responsesPrefillShape is prefillShape for a Responses prefill leg.
func responsesPrefillShape(q *inferReq, engine string) *httpError {
	if v, present, err := intField(q.raw, "max_output_tokens"); err != nil || !present || v != 1 {
		return badRequest("max_output_tokens", "a %s prefill leg of the responses API must set \"max_output_tokens\": 1, got %s", engine, describeKey(q.raw, "max_output_tokens"))
	}
	if q.stream {
		return badRequest("stream", "a %s prefill leg must not stream: set \"stream\": false", engine)
	}
	for _, k := range []string{"store", "background"} {
		if q.raw[k] != false {
			return badRequest(k, "a %s prefill leg of the responses API must set %q: false (its answer is read once, not kept), got %s", engine, k, describeKey(q.raw, k))
		}
	}
	return nil
}

// idPrefix is how the API's answers' ids start.
func idPrefix(api string) string {
	switch api {
	case apiChat:
		return "chatcmpl-"
	case apiMessages:
		return "msg_"
	case apiResponses:
		return "resp_"
	}
	return "cmpl-"
}

// namedEvent writes one SSE event with an event name (the Messages and Responses streams).
func (a *answer) namedEvent(name string, v map[string]any) {
	v["type"] = name
	fmt.Fprintf(a.w, "event: %s\n", name)
	a.event(v)
}

// addEvent streams output token i of a Messages or Responses answer.
func (a *answer) addEvent(tok string) {
	first := !a.started
	a.start()
	switch a.q.api {
	case apiMessages:
		if first {
			a.namedEvent("message_start", map[string]any{"message": a.messagesBody("", nil)})
			a.namedEvent("content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
		}
		a.namedEvent("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "text_delta", "text": tok}})
	case apiResponses:
		if first {
			a.namedEvent("response.created", map[string]any{"response": a.responsesBody("", "in_progress")})
		}
		a.namedEvent("response.output_text.delta", map[string]any{"output_index": 0, "content_index": 0, "delta": tok})
	}
}

// finishEvents ends a streamed Messages or Responses answer.
func (a *answer) finishEvents() {
	switch a.q.api {
	case apiMessages:
		a.namedEvent("content_block_stop", map[string]any{"index": 0})
		a.namedEvent("message_delta", map[string]any{"delta": map[string]any{"stop_reason": "max_tokens"},
			"usage": map[string]any{"output_tokens": a.tokens}})
		a.namedEvent("message_stop", map[string]any{})
	case apiResponses:
		a.namedEvent("response.completed", map[string]any{"response": a.responsesBody(a.text.String(), "incomplete")})
	}
}

// interruptedEvents ends a streamed Messages or Responses answer that was aborted.
func (a *answer) interruptedEvents() {
	a.namedEvent("error", map[string]any{"error": map[string]any{"type": "abort", "message": errAborted.Error()}})
}

// messagesBody is an Anthropic Messages answer with text, and x's keys added.
func (a *answer) messagesBody(text string, x map[string]any) map[string]any {
	m := map[string]any{"id": a.id, "type": "message", "role": "assistant", "model": a.q.model,
		"content": []any{map[string]any{"type": "text", "text": text}}, "stop_reason": "max_tokens", "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": len(a.q.ids), "output_tokens": a.tokens, "cache_read_input_tokens": a.cached}}
	for k, v := range x {
		m[k] = v
	}
	return m
}

// responsesBody is an OpenAI Responses answer with text.
func (a *answer) responsesBody(text, status string) map[string]any {
	return map[string]any{"id": a.id, "object": "response", "created_at": a.created, "model": a.q.model, "status": status,
		"output": []any{map[string]any{"type": "message", "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}},
		"max_output_tokens": a.q.maxTokens,
		"usage": map[string]any{"input_tokens": len(a.q.ids), "output_tokens": a.tokens, "total_tokens": len(a.q.ids) + a.tokens,
			"input_tokens_details": map[string]any{"cached_tokens": a.cached}}}
}

// finishJSON writes a whole Messages or Responses answer with x's top-level keys added (the
// prefill leg's kv_transfer_params).
func (a *answer) finishJSON(x extra) {
	var resp map[string]any
	if a.q.api == apiMessages {
		resp = a.messagesBody(a.text.String(), x.top)
	} else {
		resp = a.responsesBody(a.text.String(), "incomplete")
		for k, v := range x.top {
			resp[k] = v
		}
	}
	a.headers()
	writeJSON(a.w, http.StatusOK, resp)
}
