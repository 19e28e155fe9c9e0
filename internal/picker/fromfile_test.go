package picker

import (
	"context"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

func parseFile(t *testing.T, yaml string) *config.File {
	t.Helper()
	f, err := config.ParseFile("epp.yaml", []byte(yaml), config.FileOptions{KnownPluginTypes: NewRegistry().Has})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// routerOver is the router cmd/epp builds for a config file, without the PD strategy.
func routerOver(t *testing.T, f *config.File, deps *Deps) *Router {
	t.Helper()
	builtin := []Strategy{NewRandom(deps), NewLeastRequestStrategy(deps), NewPrefixCache(deps, config.DefaultPD())}
	var names []string
	for _, s := range builtin {
		names = append(names, s.Name())
	}
	fr, err := FromFile(f, NewRegistry(), deps, names)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range fr.Strategies {
		names = append(names, s.Name())
	}
	res, err := config.NewResolver(config.DefaultGateway(), config.Options{Names: config.Names{Strategies: names}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(RouterOptions{Resolver: res, Strategies: append(builtin, fr.Strategies...), Default: fr.Default})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A scheduling profile named "default" — the name the reference's example uses — is what
// requests run when nothing else names a strategy, as GIE and llm-d run a config's profile
// (issue 13: every decision stayed least-request until the profile was renamed). A
// routing-strategy header still picks another strategy.
func TestConfigFileDefaultProfileRoutes(t *testing.T) {
	f := parseFile(t, `
plugins:
- type: random-picker
  parameters: {maxNumOfEndpoints: 1}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
`)
	deps := NewDeps(nil, config.PrefixCache{})
	r := routerOver(t, f, deps)
	snap := snapOf(ep("a", "", ""), ep("b", "", ""))
	d, err := r.Schedule(context.Background(), parse(t, nil, "hi"), snap, snap.Endpoints)
	if err != nil || d.Strategy != "default" || len(d.Destination) != 1 {
		t.Fatalf("no header: %+v %v; want the file's default profile with its one endpoint", d, err)
	}
	d.Lifecycle.Done(nil)
	d, err = r.Schedule(context.Background(), parse(t, map[string]string{"routing-strategy": "least-request"}, "hi"), snap, snap.Endpoints)
	if err != nil || d.Strategy != "least-request" {
		t.Fatalf("header: %+v %v", d, err)
	}
	d.Lifecycle.Done(nil)
}

// A profile's name is matched as every strategy name is, in lower case: a profile named
// "Fast" is run by the header routing-strategy: Fast (or fast, or ROUTING_ALGORITHM=fast). It
// used to be unreachable: the header was lowered to "fast", refused with a 400 whose list of
// valid strategies named "Fast". A second profile differing only in case, or one named like a
// built-in strategy in another case, collides as an exact duplicate does.
func TestConfigFileProfileNamesMatchInAnyCase(t *testing.T) {
	f := parseFile(t, `
plugins:
- type: random-picker
  parameters: {maxNumOfEndpoints: 1}
schedulingProfiles:
- name: Fast
  plugins:
  - pluginRef: random-picker
- name: default
  plugins:
  - pluginRef: random-picker
`)
	deps := NewDeps(nil, config.PrefixCache{})
	r := routerOver(t, f, deps)
	snap := snapOf(ep("a", "", ""), ep("b", "", ""))
	for _, h := range []string{"Fast", "fast", "FAST"} {
		d, err := r.Schedule(context.Background(), parse(t, map[string]string{"routing-strategy": h}, "hi"), snap, snap.Endpoints)
		if err != nil || d.Strategy != "fast" {
			t.Fatalf("routing-strategy: %s: %+v %v; want the file's profile Fast", h, d, err)
		}
		d.Lifecycle.Done(nil)
	}
	for _, profiles := range []string{"- name: Fast\n  plugins: [{pluginRef: random-picker}]\n- name: fast\n  plugins: [{pluginRef: random-picker}]\n",
		"- name: Random\n  plugins: [{pluginRef: random-picker}]\n"} {
		_, err := FromFile(parseFile(t, "plugins:\n- type: random-picker\nschedulingProfiles:\n"+profiles), NewRegistry(), deps, []string{"random"})
		if err == nil || !strings.Contains(err.Error(), "rename it") {
			t.Errorf("%q: err = %v, want a collision", profiles, err)
		}
	}
}

// Which strategy a file makes the default: its "default" profile, its only profile, or —
// with several and none named default — none (they run when named).
func TestConfigFileDefaultStrategy(t *testing.T) {
	cases := []struct {
		name, profiles, want string
		warn                 bool
	}{
		{"one profile of any name", "- name: fast\n  plugins: [{pluginRef: queue-scorer}]\n", "fast", false},
		{"a default among several", "- name: fast\n  plugins: [{pluginRef: queue-scorer}]\n- name: default\n  plugins: [{pluginRef: queue-scorer}]\n", "default", false},
		{"several, none default", "- name: fast\n  plugins: [{pluginRef: queue-scorer}]\n- name: slow\n  plugins: [{pluginRef: queue-scorer}]\n", "", true},
		{"no profiles: GIE's implicit default", "", "default", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			yaml := "plugins:\n- type: queue-scorer\n"
			if tc.profiles != "" {
				yaml += "schedulingProfiles:\n" + tc.profiles
			}
			fr, err := FromFile(parseFile(t, yaml), NewRegistry(), NewDeps(nil, config.PrefixCache{}), nil)
			if err != nil || fr.Default != tc.want || (len(fr.Warnings) > 0) != tc.warn {
				t.Fatalf("default %q warnings %v err %v; want %q", fr.Default, fr.Warnings, err, tc.want)
			}
		})
	}
}

// A strategy from a config file is a non-PD strategy: whatever its profile, it never sends
// a whole request to a prefill-only pod (issue 11), and with only prefill pods it answers 503.
func TestConfigFileStrategyNeverPicksPrefillOnlyPods(t *testing.T) {
	f := parseFile(t, "plugins:\n- type: random-picker\nschedulingProfiles:\n- name: bare\n  plugins: [{pluginRef: random-picker}]\n")
	deps := NewDeps(nil, config.PrefixCache{})
	r := routerOver(t, f, deps)
	snap := snapOf(ep("p1", "prefill", ""), ep("d1", "decode", ""), ep("p2", "prefill", ""), ep("s1", "", ""))
	for range 50 {
		d, err := r.Schedule(context.Background(), parse(t, nil, "x"), snap, snap.Endpoints)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range d.Destination {
			if e.Role == pool.RolePrefill {
				t.Fatalf("sent a whole request to %s", e.Name)
			}
		}
		d.Lifecycle.Done(nil)
	}
	only := snapOf(ep("p1", "prefill", ""), ep("p2", "prefill", ""))
	if _, err := r.Schedule(context.Background(), parse(t, nil, "x"), only, only.Endpoints); err == nil ||
		!strings.Contains(err.Error(), "prefill-only") {
		t.Fatalf("only prefill pods: %v, want a 503 saying why", err)
	}
}

// Each mistake is an error naming the file and the line that is wrong.
func TestConfigFileErrorsNameTheLine(t *testing.T) {
	cases := []struct{ name, yaml, want string }{
		{"unknown parameter", "plugins:\n- type: max-score-picker\n  parameters:\n    maxNumOfEndpoint: 2\n",
			`epp.yaml:4: plugin "max-score-picker": plugin type "max-score-picker": parameters.maxNumOfEndpoint: is not a parameter of this plugin; known: maxNumOfEndpoints, maxFallbacks`},
		{"bad value", "plugins:\n- type: load-aware-scorer\n  parameters:\n    threshold: 0\n",
			"epp.yaml:4: plugin \"load-aware-scorer\": plugin type \"load-aware-scorer\": parameters.threshold=0: must be positive"},
		{"wrong type", "plugins:\n- type: prefix-cache-scorer\n  parameters:\n    matchLengthWeight: heavy\n",
			"epp.yaml:4: plugin \"prefix-cache-scorer\": plugin type \"prefix-cache-scorer\": parameters.matchLengthWeight=a JSON string: must be number"},
		{"parameters on a plugin that takes none", "plugins:\n- type: queue-scorer\n  parameters: {depth: 3}\n",
			"epp.yaml:3: plugin \"queue-scorer\": plugin type \"queue-scorer\": parameters.depth: is not a parameter: this plugin takes none"},
		{"a producer parameter on the scorer", "plugins:\n- type: prefix-cache-scorer\n  parameters:\n    lruCapacityPerServer: 10\n",
			"epp.yaml:4: plugin \"prefix-cache-scorer\": plugin type \"prefix-cache-scorer\": parameters.lruCapacityPerServer=10: is a producer parameter"},
		{"a handler listed in a profile", "plugins:\n- type: single-profile-handler\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: single-profile-handler\n",
			"epp.yaml:6: plugin \"single-profile-handler\" is a profile handler: declare it under plugins only"},
		{"two pickers", "plugins:\n- type: max-score-picker\n- type: random-picker\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: max-score-picker\n  - pluginRef: random-picker\n",
			"epp.yaml:8: scheduling profile \"p\" has two pickers"},
		{"a built-in strategy's name", "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: random\n  plugins: [{pluginRef: queue-scorer}]\n",
			"epp.yaml:4: scheduling profile \"random\" has the name of a built-in strategy"},
		{"a named producer that is not one", "plugins:\n- type: queue-scorer\n- type: prefix-cache-scorer\n  parameters: {prefixMatchInfoProducerName: queue-scorer}\n",
			`plugin "queue-scorer" is a queue-scorer, not an approx-prefix-cache-producer`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromFile(parseFile(t, tc.yaml), NewRegistry(), NewDeps(nil, config.PrefixCache{}), []string{"random"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n%v\nwant it to contain\n%s", err, tc.want)
			}
		})
	}
}

// Plugins may name plugins declared further down; a circle is an error.
func TestConfigFilePluginOrder(t *testing.T) {
	later := "plugins:\n- type: prefix-cache-scorer\n  parameters: {prefixMatchInfoProducerName: index}\n- type: approx-prefix-cache-producer\n  name: index\n"
	if _, err := FromFile(parseFile(t, later), NewRegistry(), NewDeps(nil, config.DefaultPD().PrefixCache), nil); err != nil {
		t.Fatalf("a scorer naming a producer declared after it: %v", err)
	}
}
