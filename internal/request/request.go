// Package request owns the parsed view of one client request: which OpenAI API it
// calls, the model, the prompt text, a token estimate, streaming and session keys.
// The body is parsed once, here; nothing downstream re-parses it to decide.
package request

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/tandem-epp/tandem/internal/apierror"
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
const HeaderSessionKey = "x-aibrix-session-key"

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

// body holds the fields Tandem reads; everything else stays opaque in Request.Body.
type body struct {
	Model    *json.RawMessage `json:"model"`
	Prompt   json.RawMessage  `json:"prompt"`
	Messages json.RawMessage  `json:"messages"`
	Stream   json.RawMessage  `json:"stream"`
}

// Parse builds a Request from the headers and the whole body. Completions and chat
// completions must be JSON objects with a model and a prompt or messages; anything else
// gets a 400 naming the field. Other APIs are never refused: what can be read is read.
func Parse(method, path string, headers map[string]string, raw []byte) (*Request, error) {
	r := &Request{Method: method, Path: path, Headers: headers, Body: raw, BodyTokens: len(raw) / 4}
	r.ID = headers["x-request-id"]
	if k := headers[HeaderSessionKey]; k != "" && len(k) <= maxSessionKeyBytes {
		r.SessionKey = k
	}
	api := APIFromPath(path)
	if len(bytes.TrimSpace(raw)) == 0 {
		if api == APIChatCompletions || api == APICompletions {
			return nil, apierror.BadRequest("bad_body", "", "the %s API needs a JSON body with \"model\" and %s", api, wants(api))
		}
		r.API = APIOther
		return r, nil
	}
	var b body
	if err := json.Unmarshal(raw, &b); err != nil {
		// Unknown routes are routed whatever their body; only the inference APIs
		// (named by the path, or unnamed because :path is missing) must be JSON.
		if api == APIOther {
			r.API = APIOther
			return r, nil
		}
		return nil, apierror.BadRequest("bad_body", "", "request body is not a JSON object: %v", err)
	}
	if api == "" {
		switch {
		case len(b.Messages) > 0:
			api = APIChatCompletions
		case len(b.Prompt) > 0:
			api = APICompletions
		default:
			api = APIOther
		}
	}
	r.API = api
	if b.Model != nil {
		_ = json.Unmarshal(*b.Model, &r.Model)
	}
	_ = json.Unmarshal(b.Stream, &r.Stream)
	if api == APIOther {
		return r, nil
	}
	if b.Model == nil || r.Model == "" {
		return nil, apierror.BadRequest("missing_model", "model", "the %s API needs a non-empty string \"model\"", api)
	}
	var err error
	switch api {
	case APIChatCompletions:
		r.Prompt, err = chatText(b.Messages)
	case APICompletions:
		r.Prompt, err = promptText(b.Prompt)
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

// promptText accepts a string, a list of strings, or token ids (one or many lists).
func promptText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", apierror.BadRequest("missing_prompt", "prompt", "the completions API needs \"prompt\" (a string, a list of strings or token ids)")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", apierror.BadRequest("bad_prompt", "prompt", "\"prompt\" must be a string, a list of strings or token ids")
	}
	var sb strings.Builder
	for _, item := range list {
		var s string
		if json.Unmarshal(item, &s) == nil {
			sb.WriteString(s)
			continue
		}
		// Token ids: keep their text form so prefix hashing and length estimates still work.
		sb.Write(item)
		sb.WriteByte(' ')
	}
	return sb.String(), nil
}

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// chatText concatenates roles and text content of the messages, in order.
func chatText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", apierror.BadRequest("missing_messages", "messages", "the chat completions API needs \"messages\", a non-empty list")
	}
	var msgs []message
	if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) == 0 {
		return "", apierror.BadRequest("bad_messages", "messages", "\"messages\" must be a non-empty list of {\"role\", \"content\"} objects")
	}
	var sb strings.Builder
	for _, m := range msgs {
		sb.WriteString(m.Role)
		sb.WriteByte('\n')
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			sb.WriteString(s)
		} else {
			var parts []contentPart
			if json.Unmarshal(m.Content, &parts) == nil {
				for _, p := range parts {
					sb.WriteString(p.Text)
				}
			}
		}
		sb.WriteByte('\n')
	}
	return sb.String(), nil
}
