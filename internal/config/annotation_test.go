package config

import (
	"reflect"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

// The seed's own annotation examples parse without a single problem.
func TestSeedAnnotationExamples(t *testing.T) {
	cases := []struct {
		name, json string
		want       ModelConfig
	}{
		{"pd default", `{
      "profiles": {
        "default": { "routingStrategy": "pd" }
      }
    }`, ModelConfig{Profiles: map[string]Profile{"default": {RoutingStrategy: "pd"}}}},
		{"locked", `{
      "lockedRoutingStrategy": "pd",
      "defaultProfile": "default",
      "profiles": {
        "default": { "routingStrategy": "pd" }
      }
    }`, ModelConfig{LockedRoutingStrategy: "pd", DefaultProfile: "default", Profiles: map[string]Profile{"default": {RoutingStrategy: "pd"}}}},
		{"standard pod", `{
        "profiles": {
          "default": {
            "routingStrategy": "pd",
            "routingConfig": { "combined": true }
          }
        }
      }`, ModelConfig{Profiles: map[string]Profile{"default": {RoutingStrategy: "pd", RoutingConfig: &RoutingConfig{Combined: true}}}}},
		{"bucket", `{
      "profiles": {
        "default": {
          "routingStrategy": "pd",
          "routingConfig": {
            "promptLenBucketMinLength": 0,
            "promptLenBucketMaxLength": 2048
          }
        }
      }
    }`, ModelConfig{Profiles: map[string]Profile{"default": {RoutingStrategy: "pd", RoutingConfig: &RoutingConfig{PromptLenBucketMaxLength: 2048}}}}},
		{"conductor", `{
      "profiles": {
        "default": {
          "routingStrategy": "pd",
          "routingConfig": {
            "prefillScorePolicy": "conductor",
            "decodeScorePolicy": "conductor"
          }
        }
      }
    }`, ModelConfig{Profiles: map[string]Profile{"default": {RoutingStrategy: "pd", RoutingConfig: &RoutingConfig{PrefillScorePolicy: "conductor", DecodeScorePolicy: "conductor"}}}}},
		{"token_load", `{"profiles":{"default":{"routingStrategy":"pd","routingConfig":{"prefillScorePolicy":"token_load"}}}}`,
			ModelConfig{Profiles: map[string]Profile{"default": {RoutingStrategy: "pd", RoutingConfig: &RoutingConfig{PrefillScorePolicy: "token_load"}}}}},
		{"hybrid", `{"profiles":{"default":{"routingStrategy":"pd","routingConfig":{"prefillScorePolicy":"hybrid_cache_load"}}}}`,
			ModelConfig{Profiles: map[string]Profile{"default": {RoutingStrategy: "pd", RoutingConfig: &RoutingConfig{PrefillScorePolicy: "hybrid_cache_load"}}}}},
		{"complete example, standard pod", `{
        "profiles": {
          "default": {
            "routingStrategy": "pd",
            "routingConfig": {
              "combined": true,
              "promptLenBucketMinLength": 2048
            }
          }
        }
      }`, ModelConfig{Profiles: map[string]Profile{"default": {RoutingStrategy: "pd", RoutingConfig: &RoutingConfig{Combined: true, PromptLenBucketMinLength: 2048}}}}},
		{"pd overrides and AIBrix-only fields", `{"profiles":{"fast":{"requestsPerSecond":5,"routingConfig":{
			"promptTokensGte": 100, "prefixCache": {"standardDeviationFactor": 2},
			"promptLengthBucketing": true, "bucketServe": true, "bucketServeMode": "rps", "handoff": "epp", "transferProof": "strict",
			"pd":{"prefillRequestTimeout":10,"decodeStreamIdleTimeout":0,"tokenLoadKVWeight":0.25,"minMatchPct":40}}}}}`,
			ModelConfig{Profiles: map[string]Profile{"fast": {RoutingConfig: &RoutingConfig{
				PromptLengthBucketing: ptr(true), BucketServe: ptr(true), BucketServeMode: "rps", Handoff: "epp", TransferProof: "strict",
				PromptTokensGte: ptr(int64(100)),
				PD:              &PDOverrides{PrefillRequestTimeout: ptr(10.0), DecodeStreamIdleTimeout: ptr(0.0), TokenLoadKVWeight: ptr(0.25), MinMatchPct: ptr(40.0)}}}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, problems, err := ParseModelConfig(c.json, Names{})
			if err != nil || len(problems) > 0 {
				t.Fatalf("err=%v problems=%v", err, problems)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %#v\nwant %#v", got, c.want)
			}
		})
	}
}

// Each bad field is rejected on its own: the problem names the path, value and rule, and the
// rest of the annotation still applies.
func TestAnnotationFieldProblems(t *testing.T) {
	cases := []struct {
		name, json string
		want       []string // problems, in order
		check      func(ModelConfig) bool
	}{
		{"unknown strategy", `{"lockedRoutingStrategy":"fastest","profiles":{"default":{"routingStrategy":"vtc"}}}`,
			[]string{`lockedRoutingStrategy="fastest": must be one of pd, random, least-request, prefix-cache, pd-predictive`,
				`profiles.default.routingStrategy="vtc": must be one of pd, random, least-request, prefix-cache, pd-predictive`},
			func(c ModelConfig) bool {
				return c.LockedRoutingStrategy == "" && c.Profiles["default"].RoutingStrategy == ""
			}},
		{"unknown policies", `{"profiles":{"default":{"routingConfig":{"prefillScorePolicy":"magic","decodeScorePolicy":"prefix_cache","combined":true}}}}`,
			[]string{`profiles.default.routingConfig.decodeScorePolicy="prefix_cache": ` + decodePolicyRule,
				`profiles.default.routingConfig.prefillScorePolicy="magic": ` + prefillPolicyRule},
			func(c ModelConfig) bool {
				rc := c.Profiles["default"].RoutingConfig
				return rc.PrefillScorePolicy == "" && rc.DecodeScorePolicy == "" && rc.Combined
			}},
		{"min above max is kept and reported", `{"profiles":{"default":{"routingConfig":{"promptLenBucketMinLength":4096,"promptLenBucketMaxLength":2048}}}}`,
			[]string{`profiles.default.routingConfig.promptLenBucketMinLength=4096: is above promptLenBucketMaxLength=2048, so this pod matches no prompt`},
			func(c ModelConfig) bool { return c.Profiles["default"].RoutingConfig.PromptLenBucketMinLength == 4096 }},
		{"negative min clamps silently, negative max rejected", `{"profiles":{"default":{"routingConfig":{"promptLenBucketMinLength":-5,"promptLenBucketMaxLength":-1}}}}`,
			[]string{`profiles.default.routingConfig.promptLenBucketMaxLength=-1: must be 0 (unlimited) or positive`},
			func(c ModelConfig) bool {
				rc := c.Profiles["default"].RoutingConfig
				return rc.PromptLenBucketMinLength == 0 && rc.PromptLenBucketMaxLength == 0
			}},
		{"wrong types", `{"profiles":{"default":{"routingConfig":{"combined":"yes","promptLenBucketMaxLength":"2048","bucketServe":1}}}}`,
			[]string{`profiles.default.routingConfig.bucketServe=1: must be true or false`,
				`profiles.default.routingConfig.combined="yes": must be true or false`,
				`profiles.default.routingConfig.promptLenBucketMaxLength="2048": must be a whole number (a JSON number, not a string): 0 (unlimited) or positive`},
			nil},
		{"bad pd overrides", `{"profiles":{"default":{"routingConfig":{"pd":{"tokenLoadKVWeight":-1,"minMatchPct":101,"prefillRequestTimeout":"10","decodeAbortTimeout":1.5,"decodeStreamIdleTimeout":30,"tokenLoadMaxSessions":5,"decodeWatchdogEngines":7}}}}}`,
			[]string{`profiles.default.routingConfig.pd.decodeAbortTimeout=1.5: must be a whole number`,
				`profiles.default.routingConfig.pd.decodeWatchdogEngines=7: must be a comma-separated list of sglang, vllm, trtllm`,
				`profiles.default.routingConfig.pd.minMatchPct=101: must be 0 to 100`,
				`profiles.default.routingConfig.pd.prefillRequestTimeout="10": must be a whole number`,
				`profiles.default.routingConfig.pd.tokenLoadKVWeight=-1: must be positive`,
				`profiles.default.routingConfig.pd.tokenLoadMaxSessions=5: is not a per-profile override; ignored`},
			func(c ModelConfig) bool {
				o := c.Profiles["default"].RoutingConfig.PD
				return reflect.DeepEqual(o, &PDOverrides{DecodeStreamIdleTimeout: ptr(30.0)})
			}},
		{"typos are reported", `{"defaultProfle":"x","profiles":{"default":{"routingStrategi":"pd","routingConfig":{"promptLenBucketMaxLenght":10}}}}`,
			[]string{`defaultProfle="x": is not a field Tandem reads; ignored`,
				`profiles.default.routingConfig.promptLenBucketMaxLenght=10: is not a field Tandem reads; ignored`,
				`profiles.default.routingStrategi="pd": is not a field Tandem reads; ignored`},
			nil},
		{"default profile must exist", `{"defaultProfile":"long","profiles":{"default":{}}}`,
			[]string{`defaultProfile="long": names no profile under profiles`},
			func(c ModelConfig) bool { return c.DefaultProfile == "" }},
		{"profile not an object", `{"profiles":{"a":[],"b":{"routingStrategy":"random"}}}`,
			[]string{`profiles.a=[]: must be an object; profile ignored`},
			func(c ModelConfig) bool {
				_, a := c.Profiles["a"]
				return !a && c.Profiles["b"].RoutingStrategy == "random"
			}},
		{"routingConfig not an object", `{"profiles":{"a":{"routingStrategy":"pd","routingConfig":"combined"}}}`,
			[]string{`profiles.a.routingConfig="combined": must be an object; routingConfig ignored`},
			func(c ModelConfig) bool {
				return c.Profiles["a"].RoutingConfig == nil && c.Profiles["a"].RoutingStrategy == "pd"
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, problems, err := ParseModelConfig(c.json, Names{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range problems {
				got = append(got, p.Error())
			}
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("problems\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
			if c.check != nil && !c.check(cfg) {
				t.Errorf("config after rejection: %#v", cfg)
			}
		})
	}
}

func TestAnnotationFatal(t *testing.T) {
	for _, raw := range []string{``, `{`, `null`, `[]`, `"pd"`, `{"profiles":[]}`, `{"profiles":"default"}`} {
		if _, _, err := ParseModelConfig(raw, Names{}); err == nil {
			t.Errorf("%q: want a fatal error", raw)
		}
	}
}

// Names from the registries replace the defaults.
func TestAnnotationUsesRegistryNames(t *testing.T) {
	n := Names{Strategies: []string{"pd", "least-request"}, PrefillPolicies: []string{"least_request"}}
	_, problems, _ := ParseModelConfig(`{"profiles":{"default":{"routingStrategy":"random","routingConfig":{"prefillScorePolicy":"prefix_cache","decodeScorePolicy":"conductor"}}}}`, n)
	if len(problems) != 2 || problems[0].Field != "profiles.default.routingConfig.prefillScorePolicy" || problems[1].Field != "profiles.default.routingStrategy" {
		t.Errorf("problems %v", problems)
	}
}

func TestCovers(t *testing.T) {
	cases := []struct {
		min, max, n int
		want        bool
	}{
		{0, 0, 0, true},         // no range: any length
		{0, 0, 1 << 30, true},   // max 0 = unlimited
		{0, 2048, 2048, true},   // inclusive upper bound
		{0, 2048, 2049, false},  //
		{2048, 0, 2047, false},  // min only
		{2048, 0, 2048, true},   // inclusive lower bound
		{-10, 100, 0, true},     // negative min counts as 0
		{100, 50, 75, false},    // min > max: never suitable
		{100, 50, 100, false},   //
		{512, 1024, 700, true},  //
		{512, 1024, 100, false}, //
		{0, -1, 5, true},        // (rejected at parse) a negative max reads as unlimited
	}
	for _, c := range cases {
		rc := RoutingConfig{PromptLenBucketMinLength: c.min, PromptLenBucketMaxLength: c.max}
		if got := rc.Covers(c.n); got != c.want {
			t.Errorf("[%d,%d] covers %d = %v, want %v", c.min, c.max, c.n, got, c.want)
		}
	}
}

// The documented model-level fields are exactly the ones the parser reads.
func TestModelFieldDocsMatchParser(t *testing.T) {
	for _, f := range modelFieldDocs {
		var raw string
		switch {
		case !strings.Contains(f.Field, "."):
			raw = `{"` + f.Field + `":` + map[string]string{"profiles": `{}`}[f.Field] + `}`
			if f.Field != "profiles" {
				raw = `{"` + f.Field + `":"pd","profiles":{"pd":{}}}`
			}
		default:
			key := f.Field[strings.LastIndex(f.Field, ".")+1:]
			raw = `{"profiles":{"p":{"` + key + `":` + map[string]string{"routingStrategy": `"pd"`, "routingConfig": `{}`}[key] + `}}}`
		}
		_, problems, err := ParseModelConfig(raw, Names{})
		if err != nil || len(problems) > 0 {
			t.Errorf("%s (%s): %v %v", f.Field, raw, err, problems)
		}
	}
}
