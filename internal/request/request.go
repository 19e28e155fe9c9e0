// Package request owns the parsed view of one client request: which OpenAI API it
// calls, the model, the prompt text, a token estimate, streaming and session keys.
// The body is parsed once, here; nothing downstream re-parses it to decide.
package request

import (
	"bytes"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/wire"
)

// API is the OpenAI endpoint a request calls.
type API string

const (
	APICompletions     API = "completions"
	APIChatCompletions API = "chat_completions"
	// APIOther covers embeddings, models and any other path: routed by the default strategy.
	APIOther API = "other"
)

// HeaderSessionKey is the caller-owned session key used by the token-load session-delta rule.
const HeaderSessionKey = wire.HeaderSessionKey

// maxSessionKeyBytes: longer keys are ignored, as the seed says.
const maxSessionKeyBytes = 256

// Request is what the picker knows about a request. Headers are keyed in lower case.
type Request struct {
	ID      string
	Method  string
	Path    string
	Headers map[string]string
	Body    []byte

	API    API
	Model  string
	Prompt string // text used for prefix hashing and the prompt-length estimate
	// PromptTokens estimates the prompt length: one token per four bytes of prompt text.
	PromptTokens int
	// BodyTokens is the seed's token-load estimate: one token per four bytes of request body.
	BodyTokens int
	Stream     bool
	// SessionKey is x-aibrix-session-key when present and at most 256 bytes.
	SessionKey string
}

// Header returns a request header by (case-insensitive) name.
func (r *Request) Header(name string) string { return r.Headers[strings.ToLower(name)] }

// APIFromPath tells chat from completions by the path, ignoring any query string.
// It returns "" when the path says nothing (no :path, or an unrelated route).
func APIFromPath(path string) API {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimRight(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return APIChatCompletions
	case strings.HasSuffix(path, "/completions"):
		return APICompletions
	case path == "":
		return ""
	}
	return APIOther
}

// Parse builds a Request from the headers and the whole body. Completions and chat
// completions must be JSON objects with a model and a prompt or messages; anything else
// gets a 400 naming the field. Other APIs are never refused: what can be read is read.
// The body is scanned once for validity and once for the four fields Tandem reads
// (gjson), which keeps parsing a 4 KiB chat body in the low microseconds.
func Parse(method, path string, headers map[string]string, raw []byte) (*Request, error) {
	r := &Request{Method: method, Path: path, Headers: headers, Body: raw, BodyTokens: len(raw) / 4}
	r.ID = headers[wire.HeaderRequestID]
	if k := headers[HeaderSessionKey]; k != "" && len(k) <= maxSessionKeyBytes {
		r.SessionKey = k
	}
	api := APIFromPath(path)
	inference := api == APIChatCompletions || api == APICompletions
	if len(bytes.TrimSpace(raw)) == 0 {
		if inference {
			return nil, apierror.BadRequest("bad_body", "", "the %s API needs a JSON body with \"model\" and %s", api, wants(api))
		}
		r.API = APIOther
		return r, nil
	}
	// Unknown routes are routed whatever their body; only the inference APIs (named by the
	// path, or unnamed because :path is missing) must be a JSON object.
	if TooDeep(raw, MaxJSONDepth) {
		// Checked before gjson reads the body: its recursion would overflow the stack.
		if api == APIOther {
			r.API = APIOther
			return r, nil
		}
		return nil, apierror.BadRequest("bad_body", "", "request body nests arrays or objects more than %d levels deep; flatten it", MaxJSONDepth)
	}
	if !gjson.ValidBytes(raw) {
		if api == APIOther {
			r.API = APIOther
			return r, nil
		}
		return nil, apierror.BadRequest("bad_body", "", "request body is not valid JSON; send a JSON object such as {\"model\": ..., \"messages\": [...]}")
	}
	root := gjson.ParseBytes(raw)
	if !root.IsObject() {
		if api == APIOther {
			r.API = APIOther
			return r, nil
		}
		return nil, apierror.BadRequest("bad_body", "", "request body must be a JSON object, not %s", kind(root))
	}
	f := root.Get
	model, prompt, messages := f("model"), f("prompt"), f("messages")
	if api == "" {
		switch {
		case messages.Exists():
			api = APIChatCompletions
		case prompt.Exists():
			api = APICompletions
		default:
			api = APIOther
		}
	}
	r.API = api
	if model.Type == gjson.String {
		r.Model = model.Str
	}
	r.Stream = f("stream").Type == gjson.True
	if api == APIOther {
		return r, nil
	}
	if r.Model == "" {
		if model.Exists() && model.Type != gjson.String {
			return nil, apierror.BadRequest("bad_model", "model", "\"model\" must be a string, not %s", kind(model))
		}
		return nil, apierror.BadRequest("missing_model", "model", "the %s API needs a non-empty string \"model\"", api)
	}
	var err error
	switch api {
	case APIChatCompletions:
		r.Prompt, err = chatText(messages)
	case APICompletions:
		r.Prompt, err = promptText(prompt)
	}
	if err != nil {
		return nil, err
	}
	r.PromptTokens = (len(r.Prompt) + 3) / 4
	return r, nil
}

func wants(api API) string {
	if api == APIChatCompletions {
		return "\"messages\""
	}
	return "\"prompt\""
}

func kind(v gjson.Result) string {
	switch {
	case v.IsArray():
		return "an array"
	case v.IsObject():
		return "an object"
	case v.Type == gjson.String:
		return "a string"
	case v.Type == gjson.Number:
		return "a number"
	case v.Type == gjson.True || v.Type == gjson.False:
		return "a boolean"
	}
	return "null"
}

// promptText accepts a string, a list of strings, or token ids (one or many lists).
func promptText(v gjson.Result) (string, error) {
	switch {
	case v.Type == gjson.String:
		return v.Str, nil
	case v.IsArray():
		var sb strings.Builder
		ok := true
		v.ForEach(func(_, item gjson.Result) bool {
			switch {
			case item.Type == gjson.String:
				sb.WriteString(item.Str)
			case item.Type == gjson.Number || item.IsArray():
				// Token ids: keep their text form so prefix hashing and length estimates work.
				sb.WriteString(item.Raw)
				sb.WriteByte(' ')
			default:
				ok = false
			}
			return ok
		})
		if ok {
			return sb.String(), nil
		}
	case !v.Exists() || v.Type == gjson.Null:
		return "", apierror.BadRequest("missing_prompt", "prompt", "the completions API needs \"prompt\" (a string, a list of strings or token ids)")
	}
	return "", apierror.BadRequest("bad_prompt", "prompt", "\"prompt\" must be a string, a list of strings or token ids")
}

// chatText concatenates roles and text content of the messages, in order.
func chatText(v gjson.Result) (string, error) {
	if !v.Exists() || v.Type == gjson.Null {
		return "", apierror.BadRequest("missing_messages", "messages", "the chat completions API needs \"messages\", a non-empty list")
	}
	bad := apierror.BadRequest("bad_messages", "messages", "\"messages\" must be a non-empty list of {\"role\", \"content\"} objects")
	if !v.IsArray() {
		return "", bad
	}
	var sb strings.Builder
	n, ok := 0, true
	v.ForEach(func(_, m gjson.Result) bool {
		if !m.IsObject() {
			ok = false
			return false
		}
		n++
		sb.WriteString(m.Get("role").String())
		sb.WriteByte('\n')
		c := m.Get("content")
		switch {
		case c.Type == gjson.String:
			sb.WriteString(c.Str)
		case c.IsArray():
			c.ForEach(func(_, part gjson.Result) bool {
				sb.WriteString(part.Get("text").String())
				return true
			})
		}
		sb.WriteByte('\n')
		return true
	})
	if !ok || n == 0 {
		return "", bad
	}
	return sb.String(), nil
}
