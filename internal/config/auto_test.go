package config

import (
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/tokenize"
	"github.com/tandem-epp/tandem/internal/wire"
)

// TestAutoProfileRules: AIBrix's order among matching profiles (more hints, then the higher
// lower bound, then the lower upper bound, prompt before max tokens; the first name among
// equals), the default profile when nothing matches, and the resolved name used for every
// pod's own routingConfig.
func TestAutoProfileRules(t *testing.T) {
	const ann = `{"defaultProfile": "base", "profiles": {
	  "base":  {"routingStrategy": "pd"},
	  "b-tie": {"routingStrategy": "random", "routingConfig": {"maxTokensGte": 100}},
	  "a-tie": {"routingStrategy": "random", "routingConfig": {"maxTokensGte": 100, "promptLenBucketMaxLength": 2048}},
	  "high":  {"routingStrategy": "random", "routingConfig": {"maxTokensGte": 500}},
	  "cap":   {"routingStrategy": "random", "routingConfig": {"maxTokensLt": 1000}},
	  "none":  {"routingStrategy": "random", "routingConfig": {"combined": true}}
	}}`
	r := newResolver(t, DefaultGateway(), nil)
	eps := []*pool.Endpoint{ep("a", "m", ann)}
	cases := []struct {
		maxTokens int64
		has       bool
		want      string
	}{
		{200, true, "a-tie"}, // a-tie and b-tie tie on every hint: the first by name; cap has a higher upper bound
		{700, true, "high"},  // the higher lower bound
		{50, true, "cap"},    // only the upper bound holds
		{5000, true, "high"}, // cap no longer holds
		{0, false, "base"},   // no max_tokens: max-token hints match nothing
	}
	for _, c := range cases {
		res, err := r.ResolveEndpointsFor(map[string]string{wire.HeaderConfigProfile: "auto"}, eps,
			Features{Prompt: tokenize.NewLength("hi"), MaxTokens: c.maxTokens, HasMaxTokens: c.has})
		if err != nil || res.ProfileName != c.want || !res.Auto {
			t.Errorf("max_tokens=%d (%v): profile %q auto=%v %v, want %q", c.maxTokens, c.has, res.ProfileName, res.Auto, err, c.want)
		}
	}
	res, _ := r.ResolveEndpointsFor(map[string]string{wire.HeaderConfigProfile: "auto"}, eps,
		Features{MaxTokens: 200, HasMaxTokens: true})
	if rc := r.PodRouting(eps[0], res.ProfileName); rc.PromptLenBucketMaxLength != 2048 {
		t.Errorf("the pod's routingConfig for the auto profile %q: %+v", res.ProfileName, rc)
	}
}

// TestAutoHintsParsed: the hints are routingConfig fields Tandem reads; a value that is not a
// whole number is reported and dropped.
func TestAutoHintsParsed(t *testing.T) {
	cfg, problems, err := ParseModelConfig(`{"profiles":{"p":{"routingConfig":{"promptTokensGte":1.5,"promptTokensLt":4096,"maxTokensGte":"10"}}}}`, Names{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.Error())
	}
	want := `profiles.p.routingConfig.maxTokensGte="10": must be a whole number; profiles.p.routingConfig.promptTokensGte=1.5: must be a whole number`
	if strings.Join(got, "; ") != want {
		t.Errorf("problems %q, want %q", got, want)
	}
	rc := cfg.Profiles["p"].RoutingConfig
	if rc.PromptTokensGte != nil || rc.PromptTokensLt == nil || *rc.PromptTokensLt != 4096 || rc.MaxTokensGte != nil {
		t.Errorf("hints %+v", rc)
	}
}
