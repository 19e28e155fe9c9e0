package request

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tandem-epp/tandem/internal/apierror"
)

// TestFieldsTandemReadsFollowVLLMsRules: the fields Tandem reads are judged as vLLM's OpenAI
// server (pydantic, lax mode) judges them. What vLLM refuses is a 400 naming the field, before
// any pod or ledger is involved; what vLLM accepts is routed, read the way vLLM reads it (a
// "stream": "yes" streams, so Tandem must treat it as streaming too).
func TestFieldsTandemReadsFollowVLLMsRules(t *testing.T) {
	const chat, comp = "/v1/chat/completions", "/v1/completions"
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name, path, body string
		param            string // non-empty: a 400 naming this field
		msg              string // part of the 400's message
		stream           bool   // accepted: the stream flag Tandem reads
		model            string
	}{
		// Defect 4 of issue 11: these were routed.
		{name: "content a number", path: chat, body: `{"model":"m","messages":[{"role":"user","content":5}]}`,
			param: "messages[0].content", msg: "string, a list of content parts or null"},
		{name: "max_tokens 1e309 (infinite)", path: chat, body: `{"model":"m",` + msgs + `,"max_tokens":1e309}`,
			param: "max_tokens", msg: "finite"},
		{name: "max_completion_tokens 1e309", path: chat, body: `{"model":"m",` + msgs + `,"max_completion_tokens":-1e309}`,
			param: "max_completion_tokens", msg: "finite"},
		{name: "duplicated model", path: chat, body: `{"model":"a",` + msgs + `,"model":"b"}`,
			param: "model", msg: "more than once"},
		{name: "duplicated stream", path: comp, body: `{"model":"m","prompt":"x","stream":false,"stream":true}`,
			param: "stream", msg: "more than once"},
		{name: "duplicated messages", path: chat, body: `{"model":"m",` + msgs + `,` + msgs + `}`,
			param: "messages", msg: "more than once"},
		{name: "stream not a boolean", path: chat, body: `{"model":"m",` + msgs + `,"stream":"maybe"}`,
			param: "stream", msg: "boolean"},
		{name: "stream 2", path: chat, body: `{"model":"m",` + msgs + `,"stream":2}`, param: "stream", msg: "boolean"},
		{name: "stream an object", path: chat, body: `{"model":"m",` + msgs + `,"stream":{}}`, param: "stream", msg: "boolean"},
		{name: "max_tokens fractional", path: comp, body: `{"model":"m","prompt":"x","max_tokens":1.5}`, param: "max_tokens", msg: "integer"},
		{name: "max_tokens a word", path: comp, body: `{"model":"m","prompt":"x","max_tokens":"ten"}`, param: "max_tokens", msg: "integer"},
		{name: "max_tokens negative", path: comp, body: `{"model":"m","prompt":"x","max_tokens":-3}`, param: "max_tokens", msg: `"max_tokens" must be 0 or more, not -3`},
		{name: "max_tokens a list", path: comp, body: `{"model":"m","prompt":"x","max_tokens":[1]}`, param: "max_tokens", msg: "integer"},
		{name: "message without role", path: chat, body: `{"model":"m","messages":[{"content":"x"}]}`, param: "messages[0].role", msg: "role"},
		{name: "role a number", path: chat, body: `{"model":"m","messages":[{"role":1,"content":"x"}]}`, param: "messages[0].role", msg: "string"},
		{name: "content part a number", path: chat, body: `{"model":"m","messages":[{"role":"user","content":["a",7]}]}`,
			param: "messages[0].content[1]", msg: "content part"},
		{name: "content a boolean", path: chat, body: `{"model":"m","messages":[{"role":"user","content":true}]}`, param: "messages[0].content"},
		{name: "message a string", path: chat, body: `{"model":"m","messages":["hi"]}`, param: "messages[0]", msg: "object"},
		{name: "messages an object", path: chat, body: `{"model":"m","messages":{"role":"user"}}`, param: "messages", msg: "list"},
		{name: "model a number", path: chat, body: `{"model":7,` + msgs + `}`, param: "model", msg: "string"},
		{name: "prompt mixes text and token ids", path: comp, body: `{"model":"m","prompt":["a",1]}`, param: "prompt"},
		{name: "prompt token id fractional", path: comp, body: `{"model":"m","prompt":[1,2.5]}`, param: "prompt"},
		{name: "prompt nested strings", path: comp, body: `{"model":"m","prompt":[["a"]]}`, param: "prompt"},
		{name: "body not UTF-8", path: chat, body: "{\"model\":\"sim\xff\"," + msgs + "}", msg: "UTF-8"},

		// What vLLM accepts is routed, read as vLLM reads it.
		{name: "stream \"yes\" streams (pydantic lax bool)", path: chat, body: `{"model":"m",` + msgs + `,"stream":"yes"}`, stream: true, model: "m"},
		{name: "stream \"Off\"", path: chat, body: `{"model":"m",` + msgs + `,"stream":"Off"}`, model: "m"},
		{name: "stream 1", path: chat, body: `{"model":"m",` + msgs + `,"stream":1}`, stream: true, model: "m"},
		{name: "stream 0.0", path: chat, body: `{"model":"m",` + msgs + `,"stream":0.0}`, model: "m"},
		{name: "stream null", path: chat, body: `{"model":"m",` + msgs + `,"stream":null}`, model: "m"},
		{name: "max_tokens 1e3", path: comp, body: `{"model":"m","prompt":"x","max_tokens":1e3}`, model: "m"},
		{name: "max_tokens \"16\"", path: comp, body: `{"model":"m","prompt":"x","max_tokens":" 16 "}`, model: "m"},
		{name: "max_tokens huge but finite", path: comp, body: `{"model":"m","prompt":"x","max_tokens":1e30}`, model: "m"},
		{name: "max_tokens 0 (completions echo)", path: comp, body: `{"model":"m","prompt":"x","max_tokens":0,"echo":true}`, model: "m"},
		{name: "max_completion_tokens null", path: chat, body: `{"model":"m",` + msgs + `,"max_completion_tokens":null}`, model: "m"},
		// The one deliberate difference: vLLM serves its default model when none is named;
		// the Inference Extension's EPP refuses, and Tandem (which routes by it) keeps that.
		{name: "no model", path: chat, body: `{` + msgs + `}`, param: "model", msg: "non-empty string"},
		{name: "model null", path: chat, body: `{"model":null,` + msgs + `}`, param: "model", msg: "non-empty string"},
		{name: "empty messages", path: chat, body: `{"model":"m","messages":[]}`, model: "m"},
		{name: "content null (assistant with tool calls)", path: chat, body: `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[]}]}`, model: "m"},
		{name: "content absent", path: chat, body: `{"model":"m","messages":[{"role":"assistant"}]}`, model: "m"},
		{name: "content parts: text, image, bare string", path: chat,
			body:  `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}},"b"]}]}`,
			model: "m"},
		{name: "prompt token id lists", path: comp, body: `{"model":"m","prompt":[[1,2],[3.0]]}`, model: "m"},
		{name: "prompt_embeds without prompt", path: comp, body: `{"model":"m","prompt_embeds":"AAAA"}`, model: "m"},
		{name: "duplicate keys Tandem does not read are the engine's business", path: chat,
			body: `{"model":"m",` + msgs + `,"temperature":1,"temperature":0}`, model: "m"},
		{name: "other routes are not validated", path: "/v1/embeddings", body: `{"model":"e","model":"f","stream":"maybe"}`, model: "e"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse("POST", tc.path, nil, []byte(tc.body))
			if tc.param != "" || tc.msg != "" {
				var ae *apierror.Error
				if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != tc.param || !strings.Contains(ae.Message, tc.msg) {
					t.Fatalf("got %v (request %+v); want a 400 naming %q containing %q", err, r, tc.param, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused what vLLM accepts: %v", err)
			}
			if r.Stream != tc.stream || r.Model != tc.model {
				t.Fatalf("stream %v model %q, want %v %q", r.Stream, r.Model, tc.stream, tc.model)
			}
		})
	}
}

// TestClientStringsAreMadeSafeOnce: the headers Tandem reads become labels, log fields and
// upstream values; Parse is where they are made valid UTF-8 and bounded, once, for everyone
// downstream (issue 11, defect 1: "sim\xff" as a label value killed the process).
func TestClientStringsAreMadeSafeOnce(t *testing.T) {
	h := map[string]string{}
	for _, k := range ReadHeaders {
		h[k] = "bad\xff" + strings.Repeat("x", 2*MaxHeaderValueBytes)
	}
	h["authorization"] = "Bearer \xff" // forwarded as it came: not Tandem's to rewrite
	r, err := Parse("POST", "/v1/completions", h, []byte(`{"model":"m","prompt":"p"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ReadHeaders {
		v := r.Headers[k]
		if !utf8.ValidString(v) || len(v) > MaxHeaderValueBytes || !strings.HasPrefix(v, "bad\uFFFD") {
			t.Errorf("%s = %q (%d bytes): want valid UTF-8 of at most %d bytes", k, v[:min(len(v), 20)], len(v), MaxHeaderValueBytes)
		}
	}
	if r.Headers["authorization"] != "Bearer \xff" {
		t.Errorf("authorization rewritten to %q", r.Headers["authorization"])
	}
	if r.ID != r.Headers["x-request-id"] {
		t.Errorf("ID %q is not the cleaned x-request-id", r.ID)
	}

	long := strings.Repeat("m", 3*MaxModelBytes)
	r, err = Parse("POST", "/v1/completions", nil, []byte(`{"model":"`+long+`","prompt":"p"}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Model) > MaxModelBytes || !strings.HasPrefix(r.Model, "mmm") {
		t.Errorf("model of %d bytes kept as %d bytes", len(long), len(r.Model))
	}
	// A route Tandem does not validate still never hands out invalid UTF-8.
	r, err = Parse("POST", "/upload", nil, []byte("{\"model\":\"sim\xff\"}"))
	if err != nil || !utf8.ValidString(r.Model) {
		t.Fatalf("other route: %v, model %q", err, r.Model)
	}
}

// TestClientPDControlFieldsAreRemoved: the fields that make an engine connect to a host
// (kv_transfer_params, disagg_prefill_resp, bootstrap_*, disaggregated_params) are removed from
// every body, every occurrence, whatever the route, unless the operator trusts the clients.
func TestClientPDControlFieldsAreRemoved(t *testing.T) {
	body := `{"model":"m","kv_transfer_params":{"remote_host":"10.9.9.9","remote_port":1},"prompt":"p",` +
		`"bootstrap_host":"10.9.9.9","bootstrap_port":1,"bootstrap_room":7,"disaggregated_params":{"ctx_info_endpoint":"tcp://10.9.9.9:1"},` +
		`"disagg_prefill_resp":{"kv_transfer_params":{}},"kv_transfer_params":null,"max_tokens":3}`
	for _, path := range []string{"/v1/completions", "/v1/embeddings", ""} {
		r, err := Parse("POST", path, nil, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range ControlFields {
			if strings.Contains(string(r.Body), `"`+f+`"`) {
				t.Errorf("%q: %s still in the body: %s", path, f, r.Body)
			}
		}
		if want := `{"model":"m","prompt":"p","max_tokens":3}`; string(r.Body) != want {
			t.Errorf("%q: body %s, want %s", path, r.Body, want)
		}
		if got := strings.Join(r.RemovedFields, ","); got != "bootstrap_host,bootstrap_port,bootstrap_room,disagg_prefill_resp,disaggregated_params,kv_transfer_params" {
			t.Errorf("%q: removed %q", path, got)
		}
		if r.BodyTokens != len(r.Body)/4 {
			t.Errorf("body tokens %d counted on the client's body, not the one forwarded", r.BodyTokens)
		}
	}
	r, err := ParseWith("POST", "/v1/completions", nil, []byte(body), Options{TrustPDFields: true})
	if err != nil || string(r.Body) != body || r.RemovedFields != nil {
		t.Fatalf("trusted clients: body changed to %s (%v)", r.Body, err)
	}
	clean := []byte(`{"model":"m","prompt":"p"}`)
	r, err = Parse("POST", "/v1/completions", nil, clean)
	if err != nil || &r.Body[0] != &clean[0] {
		t.Fatal("a body without control fields must be kept as it is, not copied")
	}
}
