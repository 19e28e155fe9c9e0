package request

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/tokenize"
)

// lengthOf is the exact length PromptLength gives when bucketing asks about every length up
// to max: the count, as a decision sees it.
func lengthOf(t *testing.T, r *Request, max int) int {
	t.Helper()
	p := r.PromptLength.Probe()
	for b := 1; b <= max; b++ {
		p.Boundary(b)
	}
	n, _ := p.Tokens()
	return n
}

// AIBrix counts a chat's message contents joined by one space; Tandem used to count each
// message as "role\ncontent\n". This chat is 207 tokens as AIBrix counts it and 211 as the
// old text: with a bucket ending at 210 AIBrix keeps it in the bucket, and so does Tandem now.
func TestAIBrixCountExample(t *testing.T) {
	words := strings.Fields("the quick brown fox jumps over a lazy dog while gateways route prompts to pods that prefill and decode tokens")
	user := make([]string, 182)
	for i := range user {
		user[i] = words[i%len(words)]
	}
	sys, u := "You are a helpful assistant.", strings.Join(user, " ")+"."
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
		{"role": "system", "content": sys}, {"role": "user", "content": u}}})
	old, _, err := tokenize.Count("system\n"+sys+"\nuser\n"+u+"\n", 0)
	if err != nil || old != 211 {
		t.Fatalf("the old text counts %d tokens (%v), want 211: the example no longer shows the difference", old, err)
	}
	r, err := Parse("POST", "/v1/chat/completions", nil, body)
	if err != nil {
		t.Fatal(err)
	}
	if n := lengthOf(t, r, 300); n != 207 {
		t.Fatalf("bucket length %d, want AIBrix's 207", n)
	}
	// A bucket ending at 210 asks about 211 only: the prompt is below it.
	p := r.PromptLength.Probe()
	p.Boundary(211)
	if n, _ := p.Tokens(); n >= 211 {
		t.Fatalf("against a bucket ending at 210 the length is %d, want below 211", n)
	}
	// Prefix hashing keeps the text the engine sees, roles included.
	if r.Prompt != "system\n"+sys+"\nuser\n"+u+"\n" {
		t.Fatalf("hashed prompt %q", r.Prompt)
	}
}

// Content parts are counted as AIBrix counts them: the array's JSON, as sent.
func TestCountContentParts(t *testing.T) {
	parts := `[{"type":"text","text":"describe"}, {"type":"image_url","image_url":{"url":"http://x/y.png"}}]`
	body := `{"model":"m","messages":[{"role":"user","content":` + parts + `},{"role":"assistant"},{"role":"user","content":"ok"}]}`
	r, err := Parse("POST", "/v1/chat/completions", nil, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want, _, _ := tokenize.Count(parts+"  ok", 0) // the message without content adds its separator only
	if n := lengthOf(t, r, 200); n != want {
		t.Fatalf("length %d, want %d (the parts' JSON, then two separators, then ok)", n, want)
	}
	if r.Prompt != "user\ndescribe\nassistant\n\nuser\nok\n" {
		t.Fatalf("hashed prompt %q", r.Prompt)
	}
}

// A token-id prompt's length is the number of ids: no tokenizer, and the token-load estimate is
// the same number.
func TestTokenPromptLength(t *testing.T) {
	ids := make([]int, 300)
	for i := range ids {
		ids[i] = 100000 + i // long decimal forms: bytes/4 would say about 525
	}
	for _, prompt := range []any{ids, [][]int{ids[:100], ids[100:]}} {
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 5})
		r, err := Parse("POST", "/v1/completions", nil, body)
		if err != nil {
			t.Fatal(err)
		}
		if !r.TokenPrompt || r.PromptTokens != 300 || r.BodyTokens != 300 || lengthOf(t, r, 400) != 300 {
			t.Fatalf("token prompt %v, PromptTokens %d, BodyTokens %d, length %d; want 300 each", r.TokenPrompt, r.PromptTokens, r.BodyTokens, lengthOf(t, r, 400))
		}
		if n, complete := r.PromptLength.Counted(); n != 300 || !complete {
			t.Fatalf("counted %d (complete %v)", n, complete)
		}
	}
}

func TestParseMessagesAndResponses(t *testing.T) {
	cases := []struct {
		name, path, body string
		api              API
		prompt, count    string
		max              int64
		stream           bool
		param, msg       string // an error naming param, containing msg
	}{
		{name: "messages", path: "/v1/messages",
			body: `{"model":"m","max_tokens":64,"stream":true,"system":"be brief","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yo"}]}]}`,
			api:  APIMessages, prompt: "system\nbe brief\nuser\nhi\nassistant\nyo\n", count: `hi [{"type":"text","text":"yo"}]`, max: 64, stream: true},
		{name: "messages system blocks", path: "/v1/messages",
			body: `{"model":"m","max_tokens":"8","system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"q"}]}`,
			api:  APIMessages, prompt: "system\nsys\nuser\nq\n", count: "q"},
		{name: "messages without max_tokens", path: "/v1/messages", body: `{"model":"m","messages":[{"role":"user","content":"q"}]}`,
			param: "max_tokens", msg: "needs \"max_tokens\""},
		{name: "messages max_tokens 0", path: "/v1/messages", body: `{"model":"m","max_tokens":0,"messages":[]}`,
			param: "max_tokens", msg: "1 or more"},
		{name: "messages max_tokens negative", path: "/v1/messages", body: `{"model":"m","max_tokens":-3,"messages":[]}`,
			param: "max_tokens", msg: "0 or more"},
		{name: "messages content null", path: "/v1/messages", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":null}]}`,
			param: "messages[0].content", msg: "not null"},
		{name: "messages content missing", path: "/v1/messages", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user"}]}`,
			param: "messages[0].content", msg: "missing"},
		{name: "messages block without type", path: "/v1/messages", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"text":"x"}]}]}`,
			param: "messages[0].content[0]", msg: "content block"},
		{name: "messages bad system", path: "/v1/messages", body: `{"model":"m","max_tokens":1,"system":3,"messages":[]}`,
			param: "system", msg: "a number"},
		{name: "messages without model", path: "/v1/messages", body: `{"max_tokens":1,"messages":[]}`, param: "model"},
		{name: "messages count_tokens is routed", path: "/v1/messages/count_tokens", body: `{"model":"m"}`, api: APIOther},

		{name: "responses string", path: "/v1/responses", body: `{"model":"m","input":"tell me","instructions":"be kind","max_output_tokens":32}`,
			api: APIResponses, prompt: "be kind\ntell me", count: "tell me", max: 32},
		{name: "responses items", path: "/v1/responses",
			body: `{"model":"m","stream":"true","input":[{"role":"user","content":"a"},{"type":"function_call_output","call_id":"c","output":"42"},{"role":"user","content":[{"type":"input_text","text":"b"}]}]}`,
			api:  APIResponses, prompt: "user\na\n\nuser\nb\n", count: `a  [{"type":"input_text","text":"b"}]`, stream: true},
		{name: "responses without input", path: "/v1/responses", body: `{"model":"m"}`, param: "input", msg: "needs \"input\""},
		{name: "responses input number", path: "/v1/responses", body: `{"model":"m","input":4}`, param: "input", msg: "a number"},
		{name: "responses input item string", path: "/v1/responses", body: `{"model":"m","input":["x"]}`, param: "input[0]"},
		{name: "responses bad limit", path: "/v1/responses", body: `{"model":"m","input":"x","max_output_tokens":1.5}`, param: "max_output_tokens"},
		{name: "responses bad instructions", path: "/v1/responses", body: `{"model":"m","input":"x","instructions":[]}`, param: "instructions"},
		{name: "responses duplicate input", path: "/v1/responses", body: `{"model":"m","input":"x","input":"y"}`, param: "input", msg: "more than once"},
		{name: "responses retrieval is routed", path: "/v1/responses/resp_1", api: APIOther},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse("POST", tc.path, nil, []byte(tc.body))
			if tc.param != "" || tc.msg != "" {
				var ae *apierror.Error
				if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != tc.param || !strings.Contains(ae.Message, tc.msg) {
					t.Fatalf("err %v; want a 400 naming %q containing %q", err, tc.param, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.API != tc.api || r.Prompt != tc.prompt || r.Stream != tc.stream || r.MaxTokens != tc.max || r.HasMaxTokens != (tc.max > 0) {
				t.Fatalf("api %q prompt %q stream %v max %d/%v", r.API, r.Prompt, r.Stream, r.MaxTokens, r.HasMaxTokens)
			}
			if tc.api == APIOther {
				return
			}
			want, _, _ := tokenize.Count(tc.count, 0)
			if n := lengthOf(t, r, 100); n != want || r.PromptTokens != (len(tc.count)+3)/4 {
				t.Fatalf("length %d, estimate %d; want %d counted from %q", n, r.PromptTokens, want, tc.count)
			}
		})
	}
}
