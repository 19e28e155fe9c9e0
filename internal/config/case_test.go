package config

import "testing"

// TestEnumsAcceptAnyCaseWhereAIBrixDoes: AIBrix lower-cases (and trims) the decode score
// policy, the bucket-serve mode and the TensorRT-LLM schedule style before matching them, so
// a migrated Deployment that says RPS or Generation_First must route as it did there. The
// prefill score policy and the tokenizer type are matched exactly in AIBrix and stay so.
func TestEnumsAcceptAnyCaseWhereAIBrixDoes(t *testing.T) {
	cases := []struct {
		name, value string
		check       func(g Gateway) string
		want        string
	}{
		{"AIBRIX_BUCKET_SERVE_MODE", "RPS", func(g Gateway) string { return g.PD.BucketServeMode }, "rps"},
		{"AIBRIX_BUCKET_SERVE_MODE", " Throughput ", func(g Gateway) string { return g.PD.BucketServeMode }, "throughput"},
		{"AIBRIX_TRT_SCHEDULE_STYLE", "Generation_First", func(g Gateway) string { return g.PD.TRTScheduleStyle }, "generation_first"},
		{"AIBRIX_DECODE_SCORE_POLICY", "Token_Load", func(g Gateway) string { return g.PD.DecodeScorePolicy }, "token_load"},
	}
	for _, c := range cases {
		g, warns, err := FromEnv(envOf(map[string]string{c.name: c.value}))
		if err != nil || len(warns) > 0 {
			t.Errorf("%s=%q: unexpected %v %v", c.name, c.value, warns, err)
			continue
		}
		if got := c.check(g); got != c.want {
			t.Errorf("%s=%q: got %q, want %q", c.name, c.value, got, c.want)
		}
	}
	for name, value := range map[string]string{"AIBRIX_PREFILL_SCORE_POLICY": "Prefix_Cache", "AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE": "TikToken"} {
		if _, _, err := FromEnv(envOf(map[string]string{name: value})); err == nil {
			t.Errorf("%s=%q accepted; AIBrix matches it exactly", name, value)
		}
	}
	cfg, problems, err := ParseModelConfig(`{"profiles":{"default":{"routingConfig":{"decodeScorePolicy":"LEAST_REQUEST","bucketServeMode":"Rps"}}}}`, Names{})
	if err != nil || len(problems) > 0 {
		t.Fatalf("annotation: %v %v", problems, err)
	}
	if rc := cfg.Profiles["default"].RoutingConfig; rc.DecodeScorePolicy != "least_request" || rc.BucketServeMode != "rps" {
		t.Errorf("annotation read as decodeScorePolicy=%q bucketServeMode=%q", rc.DecodeScorePolicy, rc.BucketServeMode)
	}
}
