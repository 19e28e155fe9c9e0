package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// rcField is one field of a profile's routingConfig: its documentation and its parser. The
// parser returns "" or the reason the value is rejected (the field then keeps its gateway value).
type rcField struct {
	Key, Type, Default, Rule, Description string
	set                                   func(rc *RoutingConfig, raw json.RawMessage, n *Names) string
}

var rcFields = []rcField{
	{"promptLenBucketMinLength", "integer", "0", "a whole number; a negative value counts as 0",
		"Shortest prompt (tokens, inclusive) this pod serves when bucketing is on.",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			n, ok := jsonInt(raw)
			if !ok {
				return "must be a whole number" + notAString(raw)
			}
			rc.PromptLenBucketMinLength = max(n, 0)
			return ""
		}},
	{"promptLenBucketMaxLength", "integer", "0 (unlimited)", "must be 0 (unlimited) or positive",
		"Longest prompt (tokens, inclusive) this pod serves when bucketing is on. A minimum above the maximum makes the pod match no prompt.",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			n, ok := jsonInt(raw)
			if !ok {
				return "must be a whole number" + notAString(raw) + ": 0 (unlimited) or positive"
			}
			if n < 0 {
				return "must be 0 (unlimited) or positive"
			}
			rc.PromptLenBucketMaxLength = n
			return ""
		}},
	{"combined", "boolean", "false", "must be true or false",
		"Marks a standard pod (both phases) as a PD fallback: used when no complete prefill/decode pair covers the prompt, or, with prompt-length bucketing on (as in AIBrix), when PD is saturated and it is idle (docs/troubleshooting.md).",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			b, ok := jsonBool(raw)
			if !ok {
				return "must be true or false"
			}
			rc.Combined = b
			return ""
		}},
	{"prefillScorePolicy", "policy name", "AIBRIX_PREFILL_SCORE_POLICY", "must be a prefill score policy",
		"Prefill scoring policy for this profile's requests.",
		func(rc *RoutingConfig, raw json.RawMessage, n *Names) string {
			return setName(&rc.PrefillScorePolicy, raw, n.PrefillPolicies)
		}},
	{"decodeScorePolicy", "policy name (any case)", "AIBRIX_DECODE_SCORE_POLICY", "must be a decode score policy",
		"Decode scoring policy for this profile's requests. (AIBrix fails the request on an unknown name; Tandem rejects the override and keeps the gateway policy.)",
		func(rc *RoutingConfig, raw json.RawMessage, n *Names) string {
			return setEnum(&rc.DecodeScorePolicy, raw, n.DecodePolicies, AnyCase)
		}},
	{"promptLengthBucketing", "boolean", "AIBRIX_PROMPT_LENGTH_BUCKETING", "must be true or false",
		"Turns prompt-length bucketing on or off for this profile's requests.",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			return setBoolPtr(&rc.PromptLengthBucketing, raw)
		}},
	{"bucketServe", "boolean", "AIBRIX_BUCKET_SERVE", "must be true or false; true needs bucketing on",
		"Turns adaptive bucket serving on or off for this profile's requests.",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			return setBoolPtr(&rc.BucketServe, raw)
		}},
	{"bucketServeMode", "one of throughput, rps (any case)", "AIBRIX_BUCKET_SERVE_MODE", "must be one of throughput, rps",
		"Objective of the adaptive cut points for this profile.",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			return setEnum(&rc.BucketServeMode, raw, []string{"throughput", "rps"}, AnyCase)
		}},
	{"promptTokensGte", "integer", "none", "a whole number",
		"`config-profile: auto` hint: the profile matches prompts of at least this many tokens (cl100k_base, as AIBrix counts).",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			return setHint(&rc.PromptTokensGte, raw)
		}},
	{"promptTokensLt", "integer", "none", "a whole number",
		"`config-profile: auto` hint: the profile matches prompts of fewer than this many tokens.",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			return setHint(&rc.PromptTokensLt, raw)
		}},
	{"maxTokensGte", "integer", "none", "a whole number",
		"`config-profile: auto` hint: the profile matches requests whose `max_tokens` (else `max_completion_tokens`) is at least this.",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			return setHint(&rc.MaxTokensGte, raw)
		}},
	{"maxTokensLt", "integer", "none", "a whole number",
		"`config-profile: auto` hint: the profile matches requests whose `max_tokens` (else `max_completion_tokens`) is below this.",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			return setHint(&rc.MaxTokensLt, raw)
		}},
	{"sheddable", "boolean", "false", "must be true or false",
		"Marks this profile's requests sheddable: the `pd-predictive` strategy answers 429 when no pod is predicted to meet their TTFT objective.",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			b, ok := jsonBool(raw)
			if !ok {
				return "must be true or false"
			}
			rc.Sheddable = b
			return ""
		}},
	{"handoff", "one of auto, sidecar, epp", "TANDEM_PD_HANDOFF", "must be one of auto, sidecar, epp",
		"How the prefill target is handed over for this profile's requests (`sidecar` for pods behind a decode-side routing sidecar that the auto rule does not recognise).",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			return setName(&rc.Handoff, raw, []string{HandoffAuto, HandoffSidecar, HandoffEPP})
		}},
	{"transferProof", "one of lenient, strict", "TANDEM_PD_TRANSFER_PROOF", "must be one of lenient, strict",
		"What an unverified KV transfer costs this profile's PD requests (`docs/proof.md`): `lenient` serves them, `strict` fails them.",
		func(rc *RoutingConfig, raw json.RawMessage, _ *Names) string {
			return setName(&rc.TransferProof, raw, []string{TransferProofLenient, TransferProofStrict})
		}},
}

// Fields of the AIBrix annotation that Tandem does not use; they are accepted silently so AIBrix
// manifests work unchanged. Any other unknown field is reported (it is likely a typo).
var (
	ignoredProfileFields = []string{"requestsPerSecond"}
	ignoredRoutingFields = []string{"loadBalance", "prefixCache", "preble", "vtc", "autoBlend"}
)

func jsonInt(raw json.RawMessage) (int, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 32)
	return int(n), err == nil
}

// setHint reads an auto-selection hint: a JSON integer (AIBrix decodes them as integers).
func setHint(dst **int64, raw json.RawMessage) string {
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return "must be a whole number"
	}
	*dst = &n
	return ""
}

func jsonBool(raw json.RawMessage) (bool, bool) {
	switch strings.TrimSpace(string(raw)) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

func setBoolPtr(dst **bool, raw json.RawMessage) string {
	b, ok := jsonBool(raw)
	if !ok {
		return "must be true or false"
	}
	*dst = &b
	return ""
}

func setName(dst *string, raw json.RawMessage, valid []string) string {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil || !slices.Contains(valid, s) {
		return oneOf(valid)
	}
	*dst = s
	return ""
}

// setEnum is setName matching as c says (AnyCase: trimmed and lower-cased first, as AIBrix does).
func setEnum(dst *string, raw json.RawMessage, valid []string, c Case) string {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return oneOf(valid)
	}
	v, ok := matchEnum(s, valid, c)
	if !ok {
		return oneOf(valid)
	}
	*dst = v
	return ""
}

// problemList collects the rejected fields of one annotation value.
type problemList []*Problem

func (l *problemList) add(field string, value json.RawMessage, rule string) {
	*l = append(*l, &Problem{Field: field, Value: string(value), Rule: rule})
}

// object decodes raw as a JSON object; when it is not one, the problem says what is ignored.
func (l *problemList) object(path string, raw json.RawMessage, what string) (map[string]json.RawMessage, bool) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		l.add(path, raw, "must be an object; "+what+" ignored")
		return nil, false
	}
	return fields, true
}

// ParseModelConfig parses a model.aibrix.ai/config annotation value. A syntax error, or a root
// or profiles value that is not an object, is fatal (err). Any other bad field is left out of
// the result and listed in problems: the rest of the annotation still applies.
func ParseModelConfig(raw string, names Names) (cfg ModelConfig, problems []*Problem, err error) {
	names = names.withDefaults()
	var root map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &root); err != nil || root == nil {
		if err == nil {
			err = errors.New("null")
		}
		return ModelConfig{}, nil, fmt.Errorf("must be a JSON object: %w", err)
	}
	var profiles map[string]json.RawMessage
	if p, ok := root["profiles"]; ok {
		if err := json.Unmarshal(p, &profiles); err != nil {
			return ModelConfig{}, nil, fmt.Errorf("profiles must be an object of name: profile: %w", err)
		}
	}
	var l problemList
	for _, k := range sortedKeys(root) {
		v := root[k]
		switch k {
		case "profiles":
		case "lockedRoutingStrategy":
			if r := setName(&cfg.LockedRoutingStrategy, v, names.Strategies); r != "" {
				l.add(k, v, r)
			}
		case "defaultProfile":
			var s string
			if json.Unmarshal(v, &s) != nil {
				l.add(k, v, "must be a profile name")
			} else if _, ok := profiles[s]; !ok {
				l.add(k, v, "names no profile under profiles")
			} else {
				cfg.DefaultProfile = s
			}
		default:
			l.add(k, v, "is not a field Tandem reads; ignored")
		}
	}
	for _, name := range sortedKeys(profiles) {
		if p, ok := l.profile("profiles."+name, profiles[name], &names); ok {
			if cfg.Profiles == nil {
				cfg.Profiles = map[string]Profile{}
			}
			cfg.Profiles[name] = p
		}
	}
	return cfg, l, nil
}

func (l *problemList) profile(path string, raw json.RawMessage, names *Names) (Profile, bool) {
	fields, ok := l.object(path, raw, "profile")
	if !ok {
		return Profile{}, false
	}
	var p Profile
	for _, k := range sortedKeys(fields) {
		v := fields[k]
		switch k {
		case "routingStrategy":
			if r := setName(&p.RoutingStrategy, v, names.Strategies); r != "" {
				l.add(path+"."+k, v, r)
			}
		case "routingConfig":
			p.RoutingConfig = l.routingConfig(path+".routingConfig", v, names)
		default:
			if !slices.Contains(ignoredProfileFields, k) {
				l.add(path+"."+k, v, "is not a field Tandem reads; ignored")
			}
		}
	}
	return p, true
}

func (l *problemList) routingConfig(path string, raw json.RawMessage, names *Names) *RoutingConfig {
	fields, ok := l.object(path, raw, "routingConfig")
	if !ok {
		return nil
	}
	rc := &RoutingConfig{}
	for _, k := range sortedKeys(fields) {
		v := fields[k]
		if k == "pd" {
			rc.PD = l.pdOverrides(path+".pd", v)
			continue
		}
		i := slices.IndexFunc(rcFields, func(f rcField) bool { return f.Key == k })
		if i < 0 {
			if !slices.Contains(ignoredRoutingFields, k) {
				l.add(path+"."+k, v, "is not a field Tandem reads; ignored")
			}
			continue
		}
		if r := rcFields[i].set(rc, v, names); r != "" {
			l.add(path+"."+k, v, r)
		}
	}
	if lo, hi := rc.PromptLenBucketMinLength, rc.PromptLenBucketMaxLength; hi > 0 && lo > hi {
		l.add(path+".promptLenBucketMinLength", json.RawMessage(strconv.Itoa(lo)),
			fmt.Sprintf("is above promptLenBucketMaxLength=%d, so this pod matches no prompt", hi))
	}
	return rc
}

// pdOverrideFields maps a routingConfig.pd JSON field to its PDOverrides struct field.
var pdOverrideFields = func() map[string][]int {
	m := map[string][]int{}
	t := reflect.TypeFor[PDOverrides]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		m[name] = t.Field(i).Index
	}
	return m
}()

// pdOverrides reads routingConfig.pd: each field is checked with its gateway variable's rule.
// Numbers are JSON numbers; a list (decodeWatchdogEngines) is a JSON string of comma-separated
// values or an array of strings.
func (l *problemList) pdOverrides(path string, raw json.RawMessage) *PDOverrides {
	fields, ok := l.object(path, raw, "pd overrides")
	if !ok {
		return nil
	}
	o := &PDOverrides{}
	rv := reflect.ValueOf(o).Elem()
	for _, k := range sortedKeys(fields) {
		v := fields[k]
		vr, ok := varByProfileKey(k)
		idx, ok2 := pdOverrideFields[k]
		if !ok || !ok2 {
			l.add(path+"."+k, v, "is not a per-profile override; ignored")
			continue
		}
		field := rv.FieldByIndex(idx)
		text := strings.TrimSpace(string(v))
		if field.Type().Elem().Kind() == reflect.String {
			var ok bool
			if text, ok = jsonList(v); !ok {
				l.add(path+"."+k, v, vr.Rule)
				continue
			}
		}
		scratch := DefaultGateway()
		if reason := vr.set(&scratch, text); reason != "" {
			l.add(path+"."+k, v, reason)
			continue
		}
		if field.Type().Elem().Kind() == reflect.String {
			field.Set(reflect.ValueOf(&text))
			continue
		}
		f, _ := strconv.ParseFloat(text, 64)
		field.Set(reflect.ValueOf(&f))
	}
	return o
}

// jsonList reads a JSON string, or an array of strings joined with commas.
func jsonList(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var xs []string
	if json.Unmarshal(raw, &xs) == nil && len(xs) > 0 {
		return strings.Join(xs, ","), true
	}
	return "", false
}

// apply returns pd with the overrides applied. Values were validated when parsed.
func (o *PDOverrides) apply(g Gateway) PD {
	if o == nil {
		return g.PD
	}
	rv := reflect.ValueOf(o).Elem()
	for key, idx := range pdOverrideFields {
		v, ok := varByProfileKey(key)
		if !ok {
			continue
		}
		switch p := rv.FieldByIndex(idx).Interface().(type) {
		case *float64:
			if p != nil {
				v.set(&g, strconv.FormatFloat(*p, 'f', -1, 64))
			}
		case *string:
			if p != nil {
				v.set(&g, *p)
			}
		}
	}
	return g.PD
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// notAString is what to add to a number's rule when raw is a JSON string: the value may be
// right, its type is not.
func notAString(raw json.RawMessage) string {
	if len(raw) > 0 && raw[0] == '"' {
		return " (a JSON number, not a string)"
	}
	return ""
}
