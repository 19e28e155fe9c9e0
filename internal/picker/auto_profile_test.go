package picker

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// autoProfiles is AIBrix's own auto-selection example, plus a profile that is more specific
// (two prompt hints) and one that names a max_tokens range.
const autoProfiles = `{"defaultProfile": "default", "profiles": {
  "default":            {"routingStrategy": "least-request"},
  "large-input":        {"routingStrategy": "prefix-cache", "routingConfig": {"promptTokensGte": 250}},
  "medium-input":       {"routingStrategy": "random", "routingConfig": {"promptTokensGte": 250, "promptTokensLt": 400}},
  "offline-generation": {"routingStrategy": "random", "routingConfig": {"maxTokensGte": 2048}}
}}`

// TestAutoProfileEndToEnd: config-profile: auto resolves, through the Router, to the most
// specific profile whose hints match (prompt tokens counted with cl100k_base), else the
// default profile; the chosen name comes back in x-aibrix-config-profile beside the echoed
// strategy, and only for auto (as in AIBrix).
func TestAutoProfileEndToEnd(t *testing.T) {
	hello := func(n int) string { return strings.Repeat("hello ", n) } // n+1 tokens, estimate 1.5·n
	cases := []struct {
		name, header, prompt string
		maxTokens            int
		profile, strategy    string // profile "" : no x-aibrix-config-profile header
	}{
		// 300 × "hello " is 301 tokens (estimate 450): inside [250, 400) — the two-hint profile
		// is more specific than large-input's one.
		{"most specific match", "auto", hello(300), 0, "medium-input", "random"},
		// 200 × "hello " is 201 tokens: below 250, though the estimate (300) is above it.
		{"counted, not estimated", "auto", hello(200), 0, "default", "least-request"},
		{"only the lower bound holds", "auto", hello(500), 0, "large-input", "prefix-cache"},
		{"max tokens", "AUTO", "hi", 4096, "offline-generation", "random"},
		{"max tokens below the hint", " Auto ", "hi", 16, "default", "least-request"},
		{"not auto: no header", "large-input", "hi", 0, "", "prefix-cache"},
		{"no config-profile: no header", "", hello(300), 0, "", "least-request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(t, NewDeps(nil, config.PrefixCache{}), "least-request")
			snap := snapOf(ep("a", "", autoProfiles))
			body := map[string]any{"model": "m", "prompt": tc.prompt}
			if tc.maxTokens > 0 {
				body["max_tokens"] = tc.maxTokens
			}
			raw, _ := json.Marshal(body)
			headers := map[string]string{}
			if tc.header != "" {
				headers[wire.HeaderConfigProfile] = tc.header
			}
			req, err := request.Parse("POST", "/v1/completions", headers, raw)
			if err != nil {
				t.Fatal(err)
			}
			d, err := r.Schedule(context.Background(), req, snap, snap.Endpoints)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Lifecycle.Done(nil)
			got, has := d.ResponseHeaders[wire.HeaderAIBrixConfigProfile]
			if d.Strategy != tc.strategy || d.ResponseHeaders[wire.HeaderRoutingStrategy] != tc.strategy ||
				got != tc.profile || has != (tc.profile != "") {
				t.Errorf("strategy %q, %s %q (present %v); want %q, profile %q", d.Strategy, wire.HeaderAIBrixConfigProfile, got, has, tc.strategy, tc.profile)
			}
		})
	}
}
