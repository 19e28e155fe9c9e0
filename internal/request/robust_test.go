package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tandem-epp/tandem/internal/apierror"
)

// TestDeeplyNestedBodyIsRefusedNotFatal: gjson validates recursively, so a body that opens
// millions of arrays used to overflow the goroutine stack — a fatal error that kills the whole
// process, which no recover catches. Inference APIs answer 400 naming the limit; other routes
// are routed without reading the body.
func TestDeeplyNestedBodyIsRefusedNotFatal(t *testing.T) {
	deep := func(n int, open, close string) []byte {
		// Nested in a field Tandem does not read (a deep prompt is no prompt shape vLLM accepts).
		return []byte(`{"model":"m","prompt":"p","extra":` + strings.Repeat(open, n) + strings.Repeat(close, n) + `}`)
	}
	const bodyLimit = 10 << 20 // extproc.DefaultMaxBodyBytes: what reaches Parse by default
	cases := []struct {
		name, path string
		body       []byte
		status     int // 0: accepted
		api        API
	}{
		{"chat, a body-limit's worth of [", "/v1/chat/completions", bytes.Repeat([]byte("["), bodyLimit), 400, ""},
		{"no path, a body-limit's worth of [", "", bytes.Repeat([]byte("["), bodyLimit), 400, ""},
		{"completions, deep objects", "/v1/completions", deep(1<<20, `{"a":`, `}`), 400, ""},
		{"other route, deep arrays: routed unread", "/upload", bytes.Repeat([]byte("["), bodyLimit), 0, APIOther},
		{"at the limit", "/v1/completions", deep(MaxJSONDepth-1, `[`, `]`), 0, APICompletions},
		{"just over the limit", "/v1/completions", deep(MaxJSONDepth, `[`, `]`), 400, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse("POST", tc.path, nil, tc.body)
			if tc.status == 0 {
				if err != nil || r.API != tc.api {
					t.Fatalf("got %v, %v; want accepted as %q", r, err, tc.api)
				}
				return
			}
			var ae *apierror.Error
			if !errors.As(err, &ae) || ae.Status != tc.status {
				t.Fatalf("err = %v, want a %d", err, tc.status)
			}
		})
	}
	// The message names the limit when it is the depth that is refused.
	_, err := Parse("POST", "/v1/completions", nil, deep(MaxJSONDepth, `[`, `]`))
	if err == nil || !strings.Contains(err.Error(), "nest") {
		t.Fatalf("err = %v, want it to name the nesting limit", err)
	}
}

// TestTooDeep: the scanner counts nesting outside strings only.
func TestTooDeep(t *testing.T) {
	cases := []struct {
		body string
		max  int
		want bool
	}{
		{`{}`, 1, false},
		{`{"a":[1]}`, 1, true},
		{`{"a":[1]}`, 2, false},
		{`{"a":"[[[[[["}`, 1, false}, // brackets inside a string
		{`{"a":"\"[[["}`, 1, false},  // escaped quote inside a string
		{`{"a":"\\"}`, 1, false},     // escaped backslash closes the string
		{`]]]]]][[`, 2, false},       // stray closers do not lend depth
		{`]]]]]][[[`, 2, true},
		{`[[[`, 2, true}, // unterminated still counts
	}
	for _, tc := range cases {
		if got := TooDeep([]byte(tc.body), tc.max); got != tc.want {
			t.Errorf("TooDeep(%s, %d) = %v, want %v", tc.body, tc.max, got, tc.want)
		}
	}
}

// FuzzParse: no input panics or hangs Parse; every refusal is a 400 *apierror.Error with an
// OpenAI-style body; every success is consistent with what Parse promises.
func FuzzParse(f *testing.F) {
	for _, s := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"u","content":[{"type":"text","text":"x"}]}]}`},
		{"/v1/completions", `{"model":"m","prompt":[[1,2],[3]]}`},
		{"/v1/completions?x=1", `{"model":7,"prompt":"x"}`},
		{"", `{"model":"m","prompt":"x","model":"n"}`},
		{"/v1/embeddings", `{"model":"e","input":"x"}`},
		{"/upload", `not json`},
		{"/v1/completions", `[[[[[[[[`},
		{"/v1/messages", `{"model":"m","max_tokens":3,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`},
		{"/v1/responses", `{"model":"m","input":[{"role":"user","content":"x"},{"type":"function_call_output"}],"max_output_tokens":2}`},
		{"/v1/completions", `{"model":"m","prompt":[[1,2],[3]]}`},
		{"/v1/chat/completions", "{\"model\":\"m\",\"messages\":[{\"role\":\"\xff\",\"content\":\"\\ud800\"}]}"},
	} {
		f.Add("POST", s.path, "k", s.body)
	}
	f.Fuzz(func(t *testing.T, method, path, session, body string) {
		r, err := Parse(method, path, map[string]string{HeaderSessionKey: session}, []byte(body))
		if err != nil {
			var ae *apierror.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Message == "" {
				t.Fatalf("error %v, want a 400 *apierror.Error with a message", err)
			}
			var doc struct {
				Error struct{ Message, Type string } `json:"error"`
			}
			if jerr := json.Unmarshal(ae.Body(), &doc); jerr != nil || doc.Error.Message == "" || doc.Error.Type == "" {
				t.Fatalf("error body %s: %v", ae.Body(), jerr)
			}
			return
		}
		switch r.API {
		case APIChatCompletions, APICompletions, APIMessages, APIResponses:
			if r.Model == "" {
				t.Fatalf("%s accepted without a model: %s", r.API, body)
			}
		case APIOther:
		default:
			t.Fatalf("API %q", r.API)
		}
		wantBody := len(r.Body) / 4
		if r.TokenPrompt {
			wantBody = r.PromptTokens
		}
		if r.BodyTokens != wantBody || r.PromptTokens != r.PromptLength.Estimate() {
			t.Fatalf("tokens %d/%d for %d body bytes and prompt %q", r.BodyTokens, r.PromptTokens, len(r.Body), r.Prompt)
		}
		if len(session) > maxSessionKeyBytes && r.SessionKey != "" {
			t.Fatalf("session key of %d bytes kept", len(session))
		}
		// What leaves Parse is safe to become a label, a log field or a header.
		if !utf8.ValidString(r.Model) || len(r.Model) > MaxModelBytes || !utf8.ValidString(r.SessionKey) || !utf8.ValidString(r.ID) {
			t.Fatalf("unsafe strings: model %q session %q id %q", r.Model, r.SessionKey, r.ID)
		}
		// No client-sent PD control field survives in a body an engine can read.
		if members, _, ok := topLevel(r.Body); ok {
			for _, m := range members {
				if m.isControl() {
					t.Fatalf("%s left in %s", m.key, r.Body)
				}
			}
		}
	})
}

// FuzzTopLevel checks the top-level scanner against encoding/json: for every JSON object it
// finds the same members, in order, duplicates included, escapes decoded; removing the control
// fields leaves valid JSON holding exactly the other members.
func FuzzTopLevel(f *testing.F) {
	for _, s := range []string{`{}`, ` { "a" : 1 , "b":[{"c":"]"}] } `, `{"kv_transfer\u005fparams":{"x":1},"a":"\"}"}`,
		`{"a":1,"a":2,"bootstrap_host":"h","bootstrap_host":null}`, `{"a":"\\","b":-1.5e3,"c":true,"d":null}`, `[1]`, `{"a":`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		members, depth, ok := topLevel([]byte(body))
		var v any
		isObject := json.Unmarshal([]byte(body), &v) == nil && func() bool { _, o := v.(map[string]any); return o }()
		if !isObject || !utf8.ValidString(body) {
			// Invalid JSON: the scanner may say anything but must not panic (it did not).
			// encoding/json replaces invalid UTF-8 in keys, the scanner keeps the bytes.
			return
		}
		if !ok {
			t.Fatalf("a JSON object the scanner cannot read: %s", body)
		}
		if want := TooDeep([]byte(body), depth-1); !want || TooDeep([]byte(body), depth) {
			t.Fatalf("depth %d, TooDeep disagrees: %s", depth, body)
		}
		dec := json.NewDecoder(strings.NewReader(body))
		_, _ = dec.Token() // {
		var keys []string
		for dec.More() {
			k, _ := dec.Token()
			keys = append(keys, k.(string))
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		for _, m := range members {
			got = append(got, string(m.key))
			var val any
			if err := json.Unmarshal([]byte(body[m.value:m.end]), &val); err != nil {
				t.Fatalf("member %s: value %q is not the JSON value: %v", m.key, body[m.value:m.end], err)
			}
		}
		if !slices.Equal(got, keys) {
			t.Fatalf("members %q, encoding/json says %q: %s", got, keys, body)
		}
		out, removed := withoutControlFields([]byte(body), members)
		var rest map[string]any
		if err := json.Unmarshal(out, &rest); err != nil {
			t.Fatalf("removing %v left invalid JSON %s: %v", removed, out, err)
		}
		for k := range v.(map[string]any) {
			_, kept := rest[k]
			if kept == slices.Contains(ControlFields, k) {
				t.Fatalf("key %q kept=%v after removing the control fields: %s", k, kept, out)
			}
		}
	})
}

// TestControlFieldsCannotHideBehindAnEncoding: the engines' OpenAI servers (FastAPI, Python's
// json.loads on the raw bytes) read a JSON body with a UTF-8 byte-order mark, and UTF-16 or
// UTF-32 bodies, as the object they encode (json.detect_encoding). Tandem's scan does not take
// such a body for an object, so on a route it does not validate (SGLang's native /generate
// reads bootstrap_host) it used to forward bootstrap_host, kv_transfer_params and the like
// untouched. Such a body is now a 400 on every route, unless its content type says it is not
// JSON (FastAPI parses no other).
func TestControlFieldsCannotHideBehindAnEncoding(t *testing.T) {
	const obj = `{"model":"m","prompt":"p","bootstrap_host":"10.9.9.9","bootstrap_port":1,"bootstrap_room":7,` +
		`"kv_transfer_params":{"remote_host":"10.9.9.9","remote_port":1}}`
	widen := func(width int, bigEndian bool, bom []byte) []byte {
		out := append([]byte(nil), bom...)
		for _, c := range []byte(obj) {
			unit := make([]byte, width)
			if bigEndian {
				unit[width-1] = c
			} else {
				unit[0] = c
			}
			out = append(out, unit...)
		}
		return out
	}
	bodies := map[string][]byte{
		"UTF-8 with a byte-order mark": append([]byte("\xef\xbb\xbf"), obj...),
		"UTF-16LE with a BOM":          widen(2, false, []byte{0xff, 0xfe}),
		"UTF-16BE with a BOM":          widen(2, true, []byte{0xfe, 0xff}),
		"UTF-16LE":                     widen(2, false, nil),
		"UTF-16BE":                     widen(2, true, nil),
		"UTF-32LE":                     widen(4, false, nil),
		"UTF-32BE with a BOM":          widen(4, true, []byte{0, 0, 0xfe, 0xff}),
	}
	for name, body := range bodies {
		for _, path := range []string{"/generate", "/v1/completions", ""} {
			for _, ct := range []string{"", "application/json", "Application/JSON; charset=utf-16", "application/vnd.api+json"} {
				h := map[string]string{}
				if ct != "" {
					h["content-type"] = ct
				}
				r, err := Parse("POST", path, h, body)
				var ae *apierror.Error
				if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
					t.Errorf("%s to %q as %q: forwarded (%v), want a 400", name, path, ct, err)
					continue
				}
				if r != nil || !strings.Contains(ae.Message, "UTF-8") {
					t.Errorf("%s to %q: message %q does not say to send UTF-8", name, path, ae.Message)
				}
			}
		}
	}
	// A body whose content type is not JSON is never parsed as JSON by the engines: an upload
	// that happens to start with a NUL or a BOM is routed as before.
	for _, ct := range []string{"application/octet-stream", "multipart/form-data; boundary=x", "text/plain"} {
		r, err := Parse("POST", "/v1/files", map[string]string{"content-type": ct}, []byte("\x00\x01binary"))
		if err != nil || r.API != APIOther {
			t.Errorf("%s upload: %v, want it routed", ct, err)
		}
	}
}
