package request

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/apierror"
)

func TestParse(t *testing.T) {
	cases := []struct {
		name, method, path, body string
		headers                  map[string]string
		// want
		api           API
		model, prompt string
		count         string // the text bucket lengths count, when not prompt
		ids           int    // a token-id prompt's length (its PromptTokens and BodyTokens)
		stream        bool
		status        int    // non-zero: an error with this status
		param, msg    string // error's field and a part of its message
	}{
		{name: "chat", method: "POST", path: "/v1/chat/completions",
			body: `{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"!"}]}]}`,
			api:  APIChatCompletions, model: "m", prompt: "system\nbe brief\nuser\nhi!\n", stream: true,
			count: `be brief [{"type":"text","text":"hi"},{"type":"text","text":"!"}]`},
		{name: "completions string", method: "POST", path: "/v1/completions", body: `{"model":"m","prompt":"abcd"}`,
			api: APICompletions, model: "m", prompt: "abcd"},
		{name: "completions list", path: "/v1/completions?x=1", body: `{"model":"m","prompt":["ab","cd"]}`,
			api: APICompletions, model: "m", prompt: "abcd"},
		{name: "completions token ids", path: "/v1/completions", body: `{"model":"m","prompt":[1,2,3]}`,
			api: APICompletions, model: "m", prompt: "1 2 3 ", ids: 3},
		{name: "completions token id lists", path: "/v1/completions", body: `{"model":"m","prompt":[[1,2],[3,4,5]]}`,
			api: APICompletions, model: "m", prompt: "[1,2] [3,4,5] ", ids: 5},
		{name: "no path, chat by body", body: `{"model":"m","messages":[{"role":"user","content":"x"}]}`,
			api: APIChatCompletions, model: "m", prompt: "user\nx\n", count: "x"},
		{name: "no path, completions by body", body: `{"model":"m","prompt":"x"}`, api: APICompletions, model: "m", prompt: "x"},
		{name: "embeddings routed", path: "/v1/embeddings", body: `{"model":"e","input":"x"}`, api: APIOther, model: "e"},
		{name: "other path non-JSON routed", path: "/upload", body: `not json`, api: APIOther},
		{name: "GET without body", method: "GET", path: "/v1/models", api: APIOther},
		{name: "conformance body on a test route", path: "/primary-gateway-test", body: `{"model":"conformance-fake-model","prompt":"hi"}`,
			api: APIOther, model: "conformance-fake-model"},

		{name: "not JSON", path: "/v1/chat/completions", body: `{"model":`, status: 400, msg: "not valid JSON"},
		{name: "no path, not JSON", body: `hello`, status: 400, msg: "not valid JSON"},
		{name: "no path, neither messages nor prompt", body: `{"model":"m","input":"x"}`, status: 400, msg: "has no :path"},
		{name: "no path, empty body", status: 400, msg: "has no :path"},
		{name: "path / says nothing: body names the API", path: "/", body: `{"model":"m","prompt":"x"}`, api: APICompletions, model: "m", prompt: "x"},
		{name: "path / with another body is routed", path: "/", body: `{"model":"m","input":"x"}`, api: APIOther, model: "m"},
		{name: "path / without body is routed", method: "GET", path: "/", api: APIOther},
		{name: "no path, chat validated as chat", body: `{"model":"m","messages":["x"]}`, status: 400, param: "messages[0]"},
		{name: "no path, completions validated as completions", body: `{"model":"m","prompt":{"a":1}}`, status: 400, param: "prompt"},
		{name: "no path, prompt_embeds is completions", body: `{"model":"m","prompt_embeds":"AAAA"}`, api: APICompletions, model: "m"},
		{name: "array body", path: "/v1/completions", body: `[1]`, status: 400, msg: "not an array"},
		{name: "empty body on chat", path: "/v1/chat/completions", status: 400, msg: "needs a JSON body"},
		{name: "missing model", path: "/v1/chat/completions", body: `{"messages":[{"role":"user","content":"x"}]}`, status: 400, param: "model", msg: "non-empty string \"model\""},
		{name: "model not a string", path: "/v1/completions", body: `{"model":7,"prompt":"x"}`, status: 400, param: "model", msg: "not a number"},
		{name: "missing messages", path: "/v1/chat/completions", body: `{"model":"m"}`, status: 400, param: "messages", msg: "needs \"messages\""},
		{name: "empty messages: the engine's business", path: "/v1/chat/completions", body: `{"model":"m","messages":[]}`, api: APIChatCompletions, model: "m"},
		{name: "messages not objects", path: "/v1/chat/completions", body: `{"model":"m","messages":["x"]}`, status: 400, param: "messages[0]"},
		{name: "missing prompt", path: "/v1/completions", body: `{"model":"m"}`, status: 400, param: "prompt", msg: "needs \"prompt\""},
		{name: "bad prompt", path: "/v1/completions", body: `{"model":"m","prompt":{"a":1}}`, status: 400, param: "prompt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse(tc.method, tc.path, tc.headers, []byte(tc.body))
			if tc.status != 0 {
				var ae *apierror.Error
				if !errors.As(err, &ae) {
					t.Fatalf("err = %v, want an *apierror.Error", err)
				}
				if ae.Status != tc.status || ae.Param != tc.param || !strings.Contains(ae.Message, tc.msg) {
					t.Fatalf("got %d param %q %q; want %d param %q containing %q", ae.Status, ae.Param, ae.Message, tc.status, tc.param, tc.msg)
				}
				if ae.Status != http.StatusBadRequest || !strings.Contains(string(ae.Body()), `"invalid_request_error"`) {
					t.Fatalf("body %s", ae.Body())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.API != tc.api || r.Model != tc.model || r.Prompt != tc.prompt || r.Stream != tc.stream {
				t.Fatalf("got api %q model %q prompt %q stream %v", r.API, r.Model, r.Prompt, r.Stream)
			}
			count := tc.prompt
			if tc.count != "" {
				count = tc.count
			}
			wantPrompt, wantBody := (len(count)+3)/4, len(tc.body)/4
			if tc.ids > 0 {
				wantPrompt, wantBody = tc.ids, tc.ids
			}
			if r.PromptTokens != wantPrompt || r.BodyTokens != wantBody || r.TokenPrompt != (tc.ids > 0) {
				t.Fatalf("tokens %d/%d (token prompt %v), want %d/%d", r.PromptTokens, r.BodyTokens, r.TokenPrompt, wantPrompt, wantBody)
			}
		})
	}
}

func TestSessionKey(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"x"}`)
	long := strings.Repeat("k", 257)
	for key, want := range map[string]string{"abc": "abc", long: "", strings.Repeat("k", 256): strings.Repeat("k", 256)} {
		r, err := Parse("POST", "/v1/completions", map[string]string{HeaderSessionKey: key}, body)
		if err != nil {
			t.Fatal(err)
		}
		if r.SessionKey != want {
			t.Errorf("key of %d bytes: SessionKey %q, want %q", len(key), r.SessionKey, want)
		}
	}
}

func BenchmarkParseChat4KiB(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum ", 340) + `"}]}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Parse("POST", "/v1/chat/completions", nil, body); err != nil {
			b.Fatal(err)
		}
	}
}
