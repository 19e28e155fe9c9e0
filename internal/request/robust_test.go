package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

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
		case APIChatCompletions, APICompletions:
			if r.Model == "" {
				t.Fatalf("%s accepted without a model: %s", r.API, body)
			}
		case APIOther:
		default:
			t.Fatalf("API %q", r.API)
		}
		if r.BodyTokens != len(body)/4 || r.PromptTokens != (len(r.Prompt)+3)/4 {
			t.Fatalf("tokens %d/%d for %d body bytes and prompt %q", r.BodyTokens, r.PromptTokens, len(body), r.Prompt)
		}
		if len(session) > maxSessionKeyBytes && r.SessionKey != "" {
			t.Fatalf("session key of %d bytes kept", len(session))
		}
	})
}
