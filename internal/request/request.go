// Package request owns the parsed view of one client request: which OpenAI API it
// calls, the model, the prompt text, a token estimate, streaming and session keys.
// The body is parsed once, here; nothing downstream re-parses it to decide. It is also the
// boundary where client input is made safe: validation by the engines' rules, client strings
// made valid UTF-8 and bounded, client-sent PD control fields removed.
package request

import (
	"bytes"
	"mime"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/tokenize"
	"github.com/tandem-epp/tandem/internal/wire"
)

// API is the inference endpoint a request calls.
type API string

const (
	APICompletions     API = "completions"      // OpenAI /v1/completions
	APIChatCompletions API = "chat_completions" // OpenAI /v1/chat/completions
	APIMessages        API = "messages"         // Anthropic /v1/messages (vLLM, SGLang)
	APIResponses       API = "responses"        // OpenAI /v1/responses (vLLM)
	// APIOther covers embeddings, models and any other path: routed by the default strategy.
	APIOther API = "other"
)

// Inference reports whether Tandem parses and validates the API's body (every API but APIOther).
func (a API) Inference() bool {
	switch a {
	case APICompletions, APIChatCompletions, APIMessages, APIResponses:
		return true
	}
	return false
}

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

	API   API
	Model string
	// Prompt is the text prefix hashing reads: the text the engine sees, in order (roles and
	// text of every message, a Messages request's system prompt, a Responses request's
	// instructions); a token-id prompt's ids in their JSON text form.
	Prompt string
	// PromptTokens estimates the prompt length: one token per four bytes of the text
	// PromptLength counts; a token-id prompt's exact length.
	PromptTokens int
	// PromptLength is the prompt's length in cl100k_base tokens, counted only as far as the
	// decisions that compare it with a boundary need (bucketing, config-profile: auto), each
	// token at most once per request. It counts the text AIBrix counts (see countText): the
	// messages' contents joined by one space, content-part arrays as their JSON. A token-id
	// prompt's length is known without a tokenizer: the number of ids. Never nil for a parsed
	// request.
	PromptLength *tokenize.Length
	// TokenPrompt says the prompt is token ids (completions): PromptTokens is their count.
	TokenPrompt bool
	// MaxTokens is the output limit when the body has one as an integer: max_tokens, else
	// max_completion_tokens (chat, completions, Messages), max_output_tokens (Responses).
	MaxTokens    int64
	HasMaxTokens bool
	// BodyTokens is the seed's token-load estimate: one token per four bytes of request body;
	// for a token-id prompt, its length.
	BodyTokens int
	Stream     bool
	// SessionKey is x-aibrix-session-key when present and at most 256 bytes.
	SessionKey string
	// RemovedFields are the ControlFields Parse removed from the client's body (sorted);
	// Body is the body without them, the one every route forwards.
	RemovedFields []string
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
	case strings.HasSuffix(path, "/v1/messages"):
		return APIMessages
	case strings.HasSuffix(path, "/v1/responses"):
		return APIResponses
	case path == "":
		return ""
	}
	return APIOther
}

// Parse is ParseWith with the default options: client-sent PD control fields are removed.
func Parse(method, path string, headers map[string]string, raw []byte) (*Request, error) {
	return ParseWith(method, path, headers, raw, Options{})
}

// Options change what ParseWith does with a body.
type Options struct {
	// TrustPDFields keeps client-sent ControlFields in the body. Off by default: a client that
	// names the host a pod pulls KV from makes the pod connect wherever it likes (SSRF).
	TrustPDFields bool
}

// ParseWith builds a Request from the headers and the whole body. It is the one boundary where
// client input becomes what the rest of Tandem reads:
//   - the headers Tandem reads (ReadHeaders) are made valid UTF-8 and bounded, in headers
//     itself, so every later reader (labels, logs, upstream requests) sees the safe value;
//   - the ControlFields are removed from the body, whatever the route, unless trusted; a JSON
//     body in an encoding the engines decode but Tandem's scan does not (a byte-order mark,
//     UTF-16, UTF-32) is a 400 on every route for that reason;
//   - completions, chat completions, Messages and Responses are validated as vLLM's server
//     validates the fields Tandem reads (model, messages, prompt or input and their shapes,
//     stream, the output limit, duplicates of them): what it refuses is a 400 naming the
//     field, and what it accepts is read the way it reads it. Other APIs are never refused;
//   - without a path (clients that send no :path) the body names the API: "messages" is chat
//     completions, "prompt" (or "prompt_embeds") completions, anything else a 400.
//
// The body is scanned once for its top-level members, once for validity and once for the
// fields Tandem reads (gjson), which keeps parsing a 4 KiB chat body in the low microseconds.
func ParseWith(method, path string, headers map[string]string, raw []byte, o Options) (*Request, error) {
	sessionKey := headers[HeaderSessionKey] // the seed's length rule is about the key as sent
	cleanHeaders(headers)
	r := &Request{Method: method, Path: path, Headers: headers, Body: raw, BodyTokens: len(raw) / 4, PromptLength: tokenize.NewLength("")}
	r.ID = headers[wire.HeaderRequestID]
	if sessionKey != "" && len(sessionKey) <= maxSessionKeyBytes {
		r.SessionKey = headers[HeaderSessionKey]
	}
	api := APIFromPath(path)
	inference := api.Inference()
	if !o.TrustPDFields && engineReadsAsJSON(headers["content-type"]) && foreignEncoding(raw) {
		// Before the control fields are looked for: Tandem's scan reads UTF-8 without a mark,
		// so the fields of such a body would reach a pod on every route Tandem does not validate.
		return nil, apierror.BadRequest("bad_body", "",
			"request body is not plain UTF-8 JSON (it starts with a byte-order mark or is UTF-16 or UTF-32); send it UTF-8 encoded, without a byte-order mark")
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		switch {
		case inference:
			return nil, apierror.BadRequest("bad_body", "", "the %s API needs a JSON body with \"model\" and %s", api, wants(api))
		case path == "":
			return nil, noPathBody()
		}
		r.API = APIOther
		return r, nil
	}
	// Unknown routes are routed whatever their body; only the inference APIs (named by the
	// path, or unnamed because :path is missing) must be a JSON object.
	other := func(format string, args ...any) (*Request, error) {
		if api == APIOther {
			r.API = APIOther
			return r, nil
		}
		return nil, apierror.BadRequest("bad_body", "", format, args...)
	}
	members, depth, object := topLevel(raw)
	if object && !o.TrustPDFields {
		// Before anything else reads the body: every route, every strategy, forwards this one,
		// even a body Tandem then declines to read.
		raw, r.RemovedFields = withoutControlFields(raw, members)
		if r.RemovedFields != nil {
			r.Body, r.BodyTokens = raw, len(raw)/4
			members, depth, _ = topLevel(raw)
		}
	}
	if !utf8.Valid(raw) {
		// Engines decode the body as UTF-8 and refuse it; nothing of it may become a label.
		return other("request body is not valid UTF-8; send it UTF-8 encoded")
	}
	if (object && depth > MaxJSONDepth) || (!object && TooDeep(raw, MaxJSONDepth)) {
		// Checked before gjson reads the body: its recursion would overflow the stack.
		return other("request body nests arrays or objects more than %d levels deep; flatten it", MaxJSONDepth)
	}
	if !gjson.ValidBytes(raw) {
		return other("request body is not valid JSON; send a JSON object such as {\"model\": ..., \"messages\": [...]}")
	}
	if !object {
		return other("request body must be a JSON object, not %s", kind(gjson.ParseBytes(raw)))
	}
	// The members' values, read where the scan found them (the first of a repeated key).
	f := func(name string) gjson.Result {
		for _, m := range members {
			if m.is(name) {
				return gjson.ParseBytes(raw[m.value:m.end])
			}
		}
		return gjson.Result{}
	}
	model, prompt, messages := f("model"), f("prompt"), f("messages")
	if api == "" {
		// The path says nothing ("/"), or there is none (gateways that are not Envoy, such as
		// NGINX Gateway Fabric's endpoint-picker shim, send no :path): the body says which API it
		// calls, and is validated as that API. Without a path, a body that names neither is a 400.
		switch {
		case messages.Exists():
			api = APIChatCompletions
		case prompt.Exists(), f("prompt_embeds").Exists():
			api = APICompletions
		case path == "":
			return nil, noPathBody()
		default:
			api = APIOther
		}
	}
	r.API = api
	if model.Type == gjson.String {
		r.Model = clean(model.Str, MaxModelBytes)
	}
	if api == APIOther {
		r.Stream = f("stream").Type == gjson.True
		return r, nil
	}
	if err := noDuplicates(members, api); err != nil {
		return nil, err
	}
	if r.Model == "" {
		// vLLM would serve its default model; the Inference Extension's EPP (lwepp) refuses a
		// request without one, and so does Tandem, which routes by it.
		if model.Exists() && model.Type != gjson.String && model.Type != gjson.Null {
			return nil, apierror.BadRequest("bad_model", "model", "\"model\" must be a string, not %s", kind(model))
		}
		return nil, apierror.BadRequest("missing_model", "model", "the %s API needs a non-empty string \"model\"", api)
	}
	var err error
	if r.Stream, err = laxBool(f("stream"), "stream"); err != nil {
		return nil, err
	}
	limits := outputLimits(api)
	for _, k := range limits {
		if err := laxCount(f(k), k); err != nil {
			return nil, err
		}
	}
	var p prompted
	switch api {
	case APIChatCompletions:
		p, err = chatPrompt(messages)
	case APICompletions:
		p, err = promptText(prompt, f("prompt_embeds"))
	case APIMessages:
		p, err = messagesPrompt(messages, f("system"), f("max_tokens"))
	case APIResponses:
		p, err = responsesPrompt(f("input"), f("instructions"))
	}
	if err != nil {
		return nil, err
	}
	r.Prompt = p.hash
	if p.ids >= 0 {
		// Token ids need no tokenizer: the prompt is as long as the list.
		r.TokenPrompt = true
		r.PromptLength = tokenize.KnownLength(p.ids)
		r.BodyTokens = p.ids
	} else {
		r.PromptLength = tokenize.NewLength(p.count)
	}
	r.PromptTokens = r.PromptLength.Estimate()
	for _, k := range limits {
		if v := f(k); v.Type == gjson.Number {
			if n, err := strconv.ParseInt(v.Raw, 10, 64); err == nil {
				r.MaxTokens, r.HasMaxTokens = n, true
				break
			}
		}
	}
	return r, nil
}

// outputLimits are the fields that bound an API's output, the first present one read.
func outputLimits(api API) []string {
	switch api {
	case APIResponses:
		return responsesLimits
	case APIMessages:
		return messagesLimits
	}
	return openAILimits
}

var (
	openAILimits    = []string{"max_tokens", "max_completion_tokens"}
	messagesLimits  = []string{"max_tokens"}
	responsesLimits = []string{"max_output_tokens"}
)

// engineReadsAsJSON reports whether the engines' OpenAI servers parse a body of this
// content type as JSON: FastAPI does when there is none, for application/json and for
// application/*+json, and for no other type.
func engineReadsAsJSON(contentType string) bool {
	if contentType == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		mt, _, _ = strings.Cut(strings.ToLower(contentType), ";")
		mt = strings.TrimSpace(mt)
	}
	sub, ok := strings.CutPrefix(mt, "application/")
	return ok && (sub == "json" || strings.HasSuffix(sub, "+json"))
}

// foreignEncoding reports a body Python's json.loads, which the engines read bodies with,
// decodes as something other than plain UTF-8 (json.detect_encoding): a UTF-8, UTF-16 or
// UTF-32 byte-order mark, or a NUL in one of the first two bytes (UTF-16 or UTF-32 without
// one). RFC 8259 forbids all of them in JSON sent between systems.
func foreignEncoding(raw []byte) bool {
	switch {
	case bytes.HasPrefix(raw, []byte("\xef\xbb\xbf")), bytes.HasPrefix(raw, []byte{0xfe, 0xff}),
		bytes.HasPrefix(raw, []byte{0xff, 0xfe}): // the last is also UTF-32LE's mark
		return true
	case len(raw) >= 2 && (raw[0] == 0 || raw[1] == 0): // UTF-32BE's mark starts with NULs too
		return true
	}
	return false
}

// noPathBody refuses a request without :path whose body names neither chat completions nor
// completions: without the path nothing else can be told apart (a Messages body looks like chat,
// a Responses body like embeddings).
func noPathBody() error {
	return apierror.BadRequest("bad_body", "",
		"the request has no :path, so its body must be a completions (\"prompt\") or chat completions (\"messages\") JSON object with \"model\"")
}

// PathFor is the path of an inference API ("" for APIOther): where a request that came
// without :path is sent when Tandem itself calls a pod (the epp hand-off's prefill leg).
func PathFor(api API) string {
	switch api {
	case APIChatCompletions:
		return "/v1/chat/completions"
	case APICompletions:
		return "/v1/completions"
	case APIMessages:
		return "/v1/messages"
	case APIResponses:
		return "/v1/responses"
	}
	return ""
}

func wants(api API) string {
	switch api {
	case APIChatCompletions:
		return "\"messages\""
	case APIMessages:
		return "\"messages\" and \"max_tokens\""
	case APIResponses:
		return "\"input\""
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
