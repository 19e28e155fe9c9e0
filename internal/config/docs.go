package config

//go:generate go test -run TestReferenceIsCurrent . -args -update

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/tandem-epp/tandem/internal/wire"
)

// ReferencePath is where the generated reference lives, relative to the repository root.
const ReferencePath = "docs/configuration.md"

type fieldDoc struct{ Field, Type, Default, Description string }

// modelFieldDocs are the annotation fields outside routingConfig (ParseModelConfig reads them;
// a test checks both agree).
var modelFieldDocs = []fieldDoc{
	{"lockedRoutingStrategy", "strategy name", "none",
		"Pins the strategy for the whole model: the `routing-strategy` header and the profiles cannot change it."},
	{"defaultProfile", "profile name", "`default`",
		"Profile used when the request has no `config-profile` header, or names a profile that does not exist. Must name a profile under `profiles`."},
	{"profiles", "object", "none", "Named profiles: `{\"<name>\": {\"routingStrategy\": …, \"routingConfig\": {…}}}`."},
	{"profiles.<name>.routingStrategy", "strategy name", "ROUTING_ALGORITHM",
		"Strategy of this profile's requests unless locked or set by the `routing-strategy` header."},
	{"profiles.<name>.routingConfig", "object", "none", "Routing settings of this profile (below)."},
}

// unsupportedKeys are the EndpointPickerConfig sections Tandem refuses.
func unsupportedKeys() []string {
	out := make([]string, len(unsupportedSections))
	for i, u := range unsupportedSections {
		out[i] = u.key
	}
	return out
}

// exampleFile is the config file the reference shows; a test parses it.
const exampleFile = `apiVersion: llm-d.ai/v1alpha1       # optional
kind: EndpointPickerConfig        # optional; if set, must be this
plugins:
- type: prefix-cache-scorer       # a registered plugin type
  name: prefix                    # optional, defaults to the type
  parameters: {blockSize: 64}     # optional, checked by the plugin
- type: least-request-scorer
- type: max-score-picker
schedulingProfiles:
- name: default                   # what requests run unless they name a strategy
  plugins:
  - pluginRef: prefix
    weight: 3
  - pluginRef: least-request-scorer
    weight: 2
  - pluginRef: max-score-picker
gateway:                          # any gateway setting, by its key; the environment wins
  promptLengthBucketing: true
  tokenLoadKVWeight: 0.5
`

// Reference renders docs/configuration.md from the definitions in this package and the
// plugin types of the build (picker.Registry.Docs of the full registry).
func Reference(plugins []PluginDoc) []byte {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	code := func(s string) string {
		if s == "" {
			return "—"
		}
		return "`" + s + "`"
	}

	p("# Tandem configuration reference\n\n")
	p("<!-- Generated from internal/config by `go generate ./internal/config`. Do not edit by hand:\n")
	p("     TestReferenceIsCurrent fails when this file and the code disagree. -->\n\n")
	p("Tandem reads its configuration from three layers:\n\n")
	p("1. **Gateway settings**: the defaults below, then the `gateway:` section of the `--config-file`, then the\n")
	p("   environment. The environment wins over the file (file < env), so a Deployment's `env:` can override a\n")
	p("   shared config file. Every setting is validated at start: all invalid values are reported at once with the\n")
	p("   variable, the value and the rule (`AIBRIX_TOKEN_LOAD_KV_WEIGHT=-1: must be positive`), and Tandem does not start.\n")
	p("2. **The config file** (`--config-file`): plugins and scheduling profiles, an `EndpointPickerConfig` as GIE and llm-d write it; reloaded when it changes.\n")
	p("3. **Per-model profiles**: the `%s` pod annotation. A bad annotation never stops routing: the bad\n", "model.aibrix.ai/config")
	p("   field is left out (or, if the value is not usable at all, the pod keeps its last good config, else the gateway\n")
	p("   defaults) and the problem is reported in the log, a metric and a Kubernetes event on the pod. The endpoints\n")
	p("   file (`--endpoints-file`) is stricter: an annotation that is not a JSON object is an error when the file loads.\n\n")
	p("Per request, the strategy is chosen by: `lockedRoutingStrategy` > the `%s` header > the profile's\n", wire.HeaderRoutingStrategy)
	p("`routingStrategy` > `ROUTING_ALGORITHM`. The profile is the one named by the `%s` header, else\n", wire.HeaderConfigProfile)
	p("`defaultProfile`, else `%s`. `%s: auto` chooses the most specific profile whose hints match the request\n", DefaultProfileName, wire.HeaderConfigProfile)
	p("(prompt tokens counted with cl100k_base, and `max_tokens`, else `max_completion_tokens`), else the default profile,\n")
	p("and names it in the `%s` response header.\n\n", wire.HeaderAIBrixConfigProfile)

	p("## Gateway settings\n\n")
	p("Set each as an environment variable on the EPP Deployment, or under `gateway:` in the config file with the key\n")
	p("shown. An empty variable counts as unset. Durations are whole numbers of the unit in the Type column.\n")
	p("Settings with a *Profile override* can also be set per profile in `routingConfig.pd`.\n\n")
	p("| Variable | Default | Type | Rule | `gateway:` key | Profile override | Description |\n")
	p("|---|---|---|---|---|---|---|\n")
	for i := range Vars {
		v := &Vars[i]
		rule := v.Rule
		if v.KeepDefault {
			rule += "; otherwise a warning keeps the default"
		}
		p("| `%s` | %s | %s | %s | `%s` | %s | %s |\n", v.Name, code(v.Default()), cell(v.Type), cell(rule),
			v.Key, code(v.ProfileKey), cell(v.Description))
	}
	p("\nCross-field rule: `AIBRIX_BUCKET_SERVE=true` requires `AIBRIX_PROMPT_LENGTH_BUCKETING=true`; otherwise Tandem\n")
	p("does not start. Unknown `AIBRIX_*`/`TANDEM_*` variables are logged as warnings. Three more variables are the\n")
	p("defaults of `epp` flags rather than gateway settings: `TANDEM_REDIS_ADDR` (`--redis-addr`), `TANDEM_REDIS_PASSWORD`\n")
	p("(`--redis-password`) and `TANDEM_REDIS_TLS` (`--redis-tls`: `true`/`false`, `1`/`0`; any other value stops Tandem,\n")
	p("so a typo cannot send the password in plain text). A flag given on the command line wins over its variable.\n\n")

	p("## Limits (command-line flags)\n\n")
	p("What one client, or many, can make Tandem hold. A request over a limit is answered at once, never queued, and\n")
	p("Tandem's health stays SERVING. `epp --help` lists every flag.\n\n")
	p("| Flag | Default | Description |\n|---|---|---|\n")
	for _, f := range LimitFlags {
		p("| `--%s` | `%s` | %s |\n", f.Name, f.Default, cell(f.Description))
	}
	p("\n")

	p("## Gateway client (command-line flags)\n\n")
	p("What the gateway calling Tandem can do with its answer. The Endpoint Picker Protocol lets the destination\n")
	p("header carry `ip:port[,ip:port…]`, the primary then fallbacks, and requires the `envoy.lb` metadata to carry\n")
	p("the same value; a client that hands the header to a proxy as one address cannot take the list.\n\n")
	p("| Flag | Default | Description |\n|---|---|---|\n")
	for _, f := range GatewayClientFlags {
		p("| `--%s` | `%s` | %s |\n", f.Name, f.Default, cell(f.Description))
	}
	p("\n")

	p("## Config file (`--config-file`)\n\n")
	p("An `EndpointPickerConfig`, in the shape llm-d-router (`apiVersion: llm-d.ai/v1alpha1`) and GIE\n")
	p("(`inference.networking.x-k8s.io/v1alpha1`) use: llm-d-router v0.10.0's `deploy/config` files and GIE v1.3.1's\n")
	p("default config load unchanged. Decoded strictly: an unknown field, a duplicate key or a second YAML document is an\n")
	p("error naming the line, and so is a plugin type, a parameter or a section Tandem does not support. Plugin names\n")
	p("(default: the type) must be unique; every `pluginRef` must name a declared plugin, at most once per profile;\n")
	p("weights are numbers, 0 or more (1 when unset).\n\n")
	p("What the file routes, as GIE and llm-d build a scheduler from it:\n\n")
	p("- with a multi-profile handler (`disagg-profile-handler`, `roleset-pd-profile-handler`), the whole file is one\n")
	p("  routing strategy named after the handler plugin;\n")
	p("- otherwise each scheduling profile is a strategy of its own name behind a `single-profile-handler`;\n")
	p("- the file's strategy, or its profile named `%s`, or its only profile, is what requests run when neither\n", DefaultProfileName)
	p("  the model config nor the `%s` header nor `ROUTING_ALGORITHM` names a strategy;\n", wire.HeaderRoutingStrategy)
	p("- a file without `schedulingProfiles` gets one, `%s`, with every filter, scorer and picker it declares; a\n", DefaultProfileName)
	p("  profile without a picker gets a `max-score-picker`; every data producer declared runs for every request;\n")
	p("- whatever the profile, a strategy other than a PD one never sends a whole request to a prefill-only pod.\n\n")
	p("`featureGates` are accepted; gates Tandem does not know are logged and ignored (%s are known, and have no\n",
		"`"+strings.Join(sortedKeys(featureGateNotes), "`, `")+"`")
	p("effect: Tandem always runs data producers and scrapes metrics, and has no flow-control layer). The sections\n")
	p("%s are refused with the line: Tandem scrapes, parses and admits requests itself.\n\n", "`"+strings.Join(unsupportedKeys(), "`, `")+"`")
	p("**Reload.** The file is watched: a changed file is parsed, validated and built completely, then swapped in at once\n")
	p("(a request routes wholly on the old configuration or the new). A bad file changes nothing: the last good\n")
	p("configuration keeps routing, the log says what is wrong with its line, and `tandem_config_reloads_total{result=\"rejected\"}`\n")
	p("counts it (`tandem_config_file_applied` is 0 until a good version is applied). The environment still wins over the\n")
	p("file's `gateway:` section. These settings are read once, at start, and a reload that changes them is logged as\n")
	p("taking effect at the next restart: %s.\n\n", "`"+strings.Join(restartOnly, "`, `")+"`")
	p("```yaml\n%s```\n\n", exampleFile)
	p("### Plugin types\n\n")
	p("Generated from the plugin registry. Types from llm-d-router v0.10.0 and GIE v1.3.1 keep their names, parameters\n")
	p("and semantics; where Tandem reads one differently the parameter says so.\n\n")
	p("| Type | Kind | From | What it does |\n|---|---|---|---|\n")
	for _, d := range plugins {
		p("| `%s` | %s | %s | %s |\n", d.Type, d.Kind, d.Origin, cell(d.Doc))
	}
	p("\n| Type | Parameter | Type | Default | Meaning |\n|---|---|---|---|---|\n")
	for _, d := range plugins {
		for _, pd := range d.Params {
			def := pd.Default
			if def == "" {
				def = "—"
			}
			p("| `%s` | `%s` | %s | %s | %s |\n", d.Type, pd.Name, pd.Type, cell(def), cell(pd.Doc))
		}
	}
	p("\n")

	p("## Model config annotation (`model.aibrix.ai/config`)\n\n")
	p("A JSON object on the model's pods. The model-wide fields (`lockedRoutingStrategy`, `defaultProfile`, each\n")
	p("profile's `routingStrategy` and policies) are read from the first pod of the model, in endpoint order, that\n")
	p("carries a usable annotation. The per-pod fields (`promptLenBucketMinLength`, `promptLenBucketMaxLength`,\n")
	p("`combined`) are read from each pod's own annotation, for the request's profile (else that pod's default\n")
	p("profile); a pod without the annotation accepts any prompt length. Unknown fields are reported and ignored,\n")
	p("except the AIBrix fields Tandem does not use, which are ignored silently: %s.\n\n",
		strings.Join(append(append([]string{}, ignoredProfileFields...), ignoredRoutingFields...), ", "))
	p("| Field | Type | Default | Description |\n|---|---|---|---|\n")
	for _, f := range modelFieldDocs {
		p("| `%s` | %s | %s | %s |\n", f.Field, f.Type, f.Default, cell(f.Description))
	}
	p("\n### `routingConfig`\n\n")
	p("A field that breaks its rule is rejected (reported, and the gateway value stays in use for that field).\n\n")
	p("| Field | Type | Default | Rule | Description |\n|---|---|---|---|---|\n")
	for _, f := range rcFields {
		p("| `%s` | %s | %s | %s | %s |\n", f.Key, f.Type, f.Default, cell(f.Rule), cell(f.Description))
	}
	p("| `pd` | object | none | fields below | Per-profile overrides of gateway settings. |\n")
	p("\n### `routingConfig.pd`\n\n")
	p("Each field overrides its gateway setting for the profile's requests, with the same unit and rule; a value\n")
	p("that breaks the rule is rejected and the gateway value stays.\n\n")
	p("| Field | Overrides | Type | Rule |\n|---|---|---|---|\n")
	for i := range Vars {
		if v := &Vars[i]; v.ProfileKey != "" {
			p("| `%s` | `%s` | %s | %s |\n", v.ProfileKey, v.Name, cell(v.Type), cell(v.Rule))
		}
	}
	p("\nExample:\n\n```json\n")
	p(`{
  "lockedRoutingStrategy": "pd",
  "defaultProfile": "default",
  "profiles": {
    "default": {
      "routingStrategy": "pd",
      "routingConfig": {
        "promptLenBucketMinLength": 0,
        "promptLenBucketMaxLength": 2048,
        "prefillScorePolicy": "least_request",
        "pd": { "prefillRequestTimeout": 10, "decodeStreamIdleTimeout": 60 }
      }
    }
  }
}
`)
	p("```\n\n")

	p("## Strategies and score policies\n\n")
	p("| Strategy | What it picks |\n|---|---|\n")
	for _, n := range strategyDocs {
		p("| `%s` | %s |\n", n.Name, cell(n.Description))
	}
	p("\n| Prefill score policy | Score (lower is better) |\n|---|---|\n")
	for _, n := range prefillPolicyDocs {
		p("| `%s` | %s |\n", n.Name, cell(n.Description))
	}
	p("\n| Decode score policy | Score (lower is better) |\n|---|---|\n")
	for _, n := range decodePolicyDocs {
		p("| `%s` | %s |\n", n.Name, cell(n.Description))
	}
	p("\nA build may register fewer or more; an unknown name in the environment stops the start, in an annotation\n")
	p("it is rejected and reported, and in the `%s` header it is a 400 listing the valid strategies.\n\n", wire.HeaderRoutingStrategy)

	p("## Pod labels and annotations\n\n")
	p("| Name | Kind | Values | Meaning |\n|---|---|---|---|\n")
	for _, l := range labelDocs {
		p("| `%s` | %s | %s | %s |\n", l.Name, l.Kind, cell(l.Values), cell(l.Description))
	}

	p("\n## Headers\n\n")
	p("| Header | Direction | Meaning |\n|---|---|---|\n")
	for _, h := range headerDocs {
		p("| `%s` | %s | %s |\n", h.Name, h.Direction, cell(h.Description))
	}
	return b.Bytes()
}
