package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// httpError is an answer with a status and an OpenAI-style error body.
type httpError struct {
	status int
	typ    string
	param  string
	msg    string
}

func (e *httpError) Error() string { return fmt.Sprintf("%d %s", e.status, e.msg) }

func badRequest(param, format string, args ...any) *httpError {
	return &httpError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
}

func writeError(w http.ResponseWriter, e *httpError) {
	type inner struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	}
	in := inner{Message: e.msg, Type: e.typ, Code: e.status}
	if e.param != "" {
		in.Param = &e.param
	}
	writeJSON(w, e.status, map[string]any{"error": in})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// decodeObject parses a JSON object keeping numbers exact (64-bit ids must not pass through float64).
func decodeObject(raw []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("body is null, want a JSON object")
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the JSON object")
	}
	return m, nil
}

// duplicateTopLevelKey reports the first top-level key that appears twice: encoding/json
// silently keeps the last one, an engine might keep the first, so a body with a duplicate
// key means different things to different readers.
func duplicateTopLevelKey(raw []byte) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return ""
		}
		k, _ := t.(string)
		if seen[k] {
			return k
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return ""
		}
	}
	return ""
}

// intField reads an integer field. present is false when the key is absent; a null value
// is present but not an integer.
func intField(m map[string]any, key string) (v int64, present bool, err error) {
	raw, ok := m[key]
	if !ok {
		return 0, false, nil
	}
	v, err = asInt(raw)
	if err != nil {
		return 0, true, fmt.Errorf("%q must be an integer, got %s", key, describe(raw))
	}
	return v, true, nil
}

func asInt(raw any) (int64, error) {
	n, ok := raw.(json.Number)
	if !ok {
		return 0, fmt.Errorf("not a number")
	}
	if strings.ContainsAny(n.String(), ".eE") {
		return 0, fmt.Errorf("not an integer literal")
	}
	return n.Int64()
}

// laxBool reads a request's boolean as vLLM's pydantic models do (lax mode): true/false, 0/1,
// or one of the strings pydantic takes for them, in any case.
func laxBool(v any) (b, ok bool) {
	switch x := v.(type) {
	case bool:
		return x, true
	case json.Number:
		if f, err := x.Float64(); err == nil && (f == 0 || f == 1) {
			return f == 1, true
		}
	case string:
		switch strings.ToLower(x) {
		case "1", "on", "t", "true", "y", "yes":
			return true, true
		case "0", "off", "f", "false", "n", "no":
			return false, true
		}
	}
	return false, false
}

// laxInt reads a request's token limit as vLLM's pydantic models do (lax mode), as Tandem
// reads it: a boolean (0 or 1), or a finite number or numeric string with no fractional part.
func laxInt(v any) (int64, error) {
	var f float64
	var err error
	switch x := v.(type) {
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	case json.Number:
		if n, err := asInt(x); err == nil {
			return n, nil
		}
		f, err = x.Float64()
	case string:
		f, err = strconv.ParseFloat(strings.TrimSpace(x), 64)
	default:
		return 0, fmt.Errorf("not a number")
	}
	if err != nil || f != math.Trunc(f) || math.Abs(f) > math.MaxInt64/2 {
		return 0, fmt.Errorf("not an integer")
	}
	return int64(f), nil
}

// describe names a JSON value's type and value for error messages.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return fmt.Sprintf("boolean %v", x)
	case json.Number:
		return "number " + x.String()
	case string:
		if len(x) > 40 {
			x = x[:40] + "…"
		}
		return fmt.Sprintf("string %q", x)
	case []any:
		return fmt.Sprintf("array of %d", len(x))
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// APIs the simulator serves, told by the path.
const (
	apiCompletions = "completions"
	apiChat        = "chat"
	apiMessages    = "messages"  // Anthropic /v1/messages
	apiResponses   = "responses" // OpenAI /v1/responses
)

// apiOf names the API of a path.
func apiOf(path string) string {
	path = strings.TrimRight(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return apiChat
	case strings.HasSuffix(path, "/v1/messages"):
		return apiMessages
	case strings.HasSuffix(path, "/v1/responses"):
		return apiResponses
	}
	return apiCompletions
}

// limitKeys are the fields that bound an API's output (the last present one wins, as in
// vLLM's chat API).
func limitKeys(api string) []string {
	switch api {
	case apiMessages:
		return []string{"max_tokens"}
	case apiResponses:
		return []string{"max_output_tokens"}
	}
	return []string{"max_tokens", "max_completion_tokens"}
}

// inferReq is the simulator's view of an inference body.
type inferReq struct {
	api       string
	chat      bool
	raw       map[string]any
	model     string
	ids       []int64 // prompt tokens
	hash      uint64  // promptHash(ids)
	stream    bool
	streamSet bool
	usage     bool // stream_options.include_usage
	maxTokens int  // output tokens to generate
	maxSet    bool
	rid       string
	// wrongKVPort: a prefill leg announces a KV port nothing listens on (Faults.WrongKVPort).
	wrongKVPort bool
}

func (q *inferReq) has(key string) bool { _, ok := q.raw[key]; return ok }

// parseInference reads the fields every engine needs and rejects what no engine accepts.
func parseInference(path string, body []byte, p Params) (*inferReq, *httpError) {
	m, err := decodeObject(body)
	if err != nil {
		return nil, badRequest("", "request body is not a JSON object: %v", err)
	}
	if k := duplicateTopLevelKey(body); k != "" {
		return nil, badRequest(k, "top-level key %q appears twice; send each key once", k)
	}
	q := &inferReq{api: apiOf(path), raw: m}
	q.chat = q.api == apiChat
	var ok bool
	if q.model, ok = m["model"].(string); !ok || q.model == "" {
		return nil, badRequest("model", "\"model\" must be a non-empty string, got %s", describe(m["model"]))
	}
	if v, ok := m["stream"]; ok && v != nil {
		b, isBool := laxBool(v)
		if !isBool {
			return nil, badRequest("stream", "\"stream\" must be a boolean, got %s", describe(v))
		}
		q.stream, q.streamSet = b, true
	}
	if v, ok := m["stream_options"]; ok && v != nil {
		so, isObj := v.(map[string]any)
		if !isObj {
			return nil, badRequest("stream_options", "\"stream_options\" must be an object, got %s", describe(v))
		}
		if iu, ok := so["include_usage"]; ok && iu != nil {
			b, isBool := iu.(bool)
			if !isBool {
				return nil, badRequest("stream_options.include_usage", "\"stream_options.include_usage\" must be a boolean, got %s", describe(iu))
			}
			q.usage = b
		}
	}
	q.maxTokens = p.DefaultMaxTokens
	if raw, ok := m["max_tokens"]; q.api == apiMessages && (!ok || raw == nil) {
		return nil, badRequest("max_tokens", "the messages API needs \"max_tokens\", an integer ≥ 1")
	}
	for _, key := range limitKeys(q.api) {
		if raw, ok := m[key]; ok && raw != nil {
			v, err := laxInt(raw)
			if err != nil || v < 1 {
				return nil, badRequest(key, "%q must be an integer ≥ 1, got %s", key, describe(raw))
			}
			q.maxTokens, q.maxSet = int(min(v, math.MaxInt32)), true
		}
	}
	if v, present, err := intField(m, "min_tokens"); err != nil {
		return nil, badRequest("min_tokens", "%v", err)
	} else if present && int(v) > q.maxTokens {
		return nil, badRequest("min_tokens", "min_tokens (%d) must be ≤ max_tokens (%d)", v, q.maxTokens)
	}
	if v, present, err := intField(m, "n"); err != nil || (present && v != 1) {
		return nil, badRequest("n", "the simulator serves n=1 only, got %s", describe(m["n"]))
	}
	if v, ok := m["rid"]; ok {
		s, isStr := v.(string)
		if !isStr || s == "" {
			return nil, badRequest("rid", "\"rid\" must be a non-empty string, got %s", describe(v))
		}
		q.rid = s
	}
	if herr := q.readPrompt(); herr != nil {
		return nil, herr
	}
	q.hash = promptHash(q.ids)
	return q, nil
}

// readPrompt tokenizes the prompt. Token ids in the body (a completions prompt given as ids,
// or TensorRT-LLM's prompt_token_ids) are used as they are.
func (q *inferReq) readPrompt() *httpError {
	if raw, ok := q.raw["prompt_token_ids"]; ok && raw != nil {
		ids, err := intList(raw)
		if err != nil || len(ids) == 0 {
			return badRequest("prompt_token_ids", "\"prompt_token_ids\" must be a non-empty array of integers: %v", err)
		}
		q.ids = ids
		return nil
	}
	switch q.api {
	case apiMessages:
		return q.readMessages()
	case apiResponses:
		return q.readResponses()
	}
	if q.chat {
		msgs, ok := q.raw["messages"].([]any)
		if !ok || len(msgs) == 0 {
			return badRequest("messages", "\"messages\" must be a non-empty array, got %s", describe(q.raw["messages"]))
		}
		var sb strings.Builder
		for i, m := range msgs {
			obj, ok := m.(map[string]any)
			role, _ := obj["role"].(string)
			if !ok || role == "" {
				return badRequest("messages", "messages[%d] needs a string \"role\"", i)
			}
			sb.WriteString(role)
			sb.WriteByte('\n')
			switch c := obj["content"].(type) {
			case string:
				sb.WriteString(c)
			case []any:
				for _, part := range c {
					if p, ok := part.(map[string]any); ok {
						t, _ := p["text"].(string)
						sb.WriteString(t)
					}
				}
			}
			sb.WriteByte('\n')
		}
		q.ids = Tokenize(sb.String())
		return nil
	}
	switch p := q.raw["prompt"].(type) {
	case string:
		q.ids = Tokenize(p)
	case []any:
		if len(p) == 1 {
			if s, ok := p[0].(string); ok {
				q.ids = Tokenize(s)
				break
			}
			if inner, ok := p[0].([]any); ok {
				p = inner
			}
		}
		ids, err := intList(p)
		if err != nil {
			return badRequest("prompt", "\"prompt\" must be a string, one string in an array, or token ids (batched prompts are not simulated): %v", err)
		}
		q.ids = ids
	default:
		return badRequest("prompt", "\"prompt\" must be a string or token ids, got %s", describe(q.raw["prompt"]))
	}
	if len(q.ids) == 0 {
		return badRequest("prompt", "\"prompt\" is empty")
	}
	return nil
}

func intList(raw any) ([]int64, error) {
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("got %s", describe(raw))
	}
	ids := make([]int64, len(list))
	for i, v := range list {
		n, err := asInt(v)
		if err != nil {
			return nil, fmt.Errorf("element %d is %s, want an integer", i, describe(v))
		}
		ids[i] = n
	}
	return ids, nil
}

// prefillShape checks what every engine's prefill leg must carry: one output token (max_tokens
// 1; max_completion_tokens 1 or absent, as AIBrix deletes it for TensorRT-LLM), no streaming.
// A Responses prefill leg sets max_output_tokens 1 and is neither stored nor in the background.
func prefillShape(q *inferReq, engine string) *httpError {
	if q.api == apiResponses {
		return responsesPrefillShape(q, engine)
	}
	v, present, err := intField(q.raw, "max_tokens")
	if err != nil || !present || v != 1 {
		return badRequest("max_tokens", "a %s prefill leg must set \"max_tokens\": 1, got %s", engine, describeKey(q.raw, "max_tokens"))
	}
	if v, present, err := intField(q.raw, "max_completion_tokens"); present && (err != nil || v != 1) {
		return badRequest("max_completion_tokens", "a %s prefill leg must set \"max_completion_tokens\" to 1 or leave it out, got %s", engine, describe(q.raw["max_completion_tokens"]))
	}
	if q.stream {
		return badRequest("stream", "a %s prefill leg must not stream: set \"stream\": false", engine)
	}
	if q.has("stream_options") {
		return badRequest("stream_options", "a %s prefill leg must not carry \"stream_options\" (it does not stream); delete the key", engine)
	}
	if v, present, _ := intField(q.raw, "min_tokens"); present && v > 1 {
		return badRequest("min_tokens", "a %s prefill leg generates one token; \"min_tokens\" %d must be deleted", engine, v)
	}
	return nil
}

func describeKey(m map[string]any, key string) string {
	v, ok := m[key]
	if !ok {
		return "no key"
	}
	return describe(v)
}
