package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tandem-epp/tandem/internal/suggest"
)

// FileKind is the kind a --config-file may declare (GIE's and llm-d's EndpointPickerConfig).
const FileKind = "EndpointPickerConfig"

// FileAPIVersions are the apiVersions a --config-file may declare: llm-d-router's current one
// and the one GIE v1.3.1 (and llm-d before it) use.
var FileAPIVersions = []string{"llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1"}

// File is a parsed, validated --config-file: plugins, scheduling profiles, feature gates and
// the gateway: section (applied by Load, under the environment).
type File struct {
	Name               string // as given to ParseFile; errors are prefixed with it
	Plugins            []PluginSpec
	SchedulingProfiles []SchedulingProfile
	FeatureGates       []FeatureGate
	// Warnings are problems that do not stop the file from loading (an unknown feature gate).
	Warnings []string

	settings []setting
}

// FeatureGate is one featureGates entry: "name", "name=true" or "name=false".
type FeatureGate struct {
	Name    string
	Enabled bool
	Line    int
}

// featureGateNotes are the gates GIE v1.3.1 and llm-d-router v0.10.0 register, with what they
// mean in Tandem; any other gate is reported and ignored.
var featureGateNotes = map[string]string{
	"prepareDataPlugins":           "", // Tandem always runs data producers
	"dataLayer":                    "", // Tandem always scrapes the engines' metrics
	"haPopulateNonLeaderDatastore": "", // every Tandem replica keeps its own datastore
	"flowControl":                  "Tandem has no flow-control layer; the gate has no effect",
}

// PluginSpec declares one plugin instance.
type PluginSpec struct {
	Type string
	Name string // unique; defaults to Type
	// Parameters is the plugin's parameters object as JSON (nil when absent); the plugin's
	// factory decodes it.
	Parameters json.RawMessage
	Line       int
	// ParamLines maps each parameter (dotted for nested objects: deciders.prefill) to its
	// line, so an error about one names the line it is on.
	ParamLines map[string]int
}

// ParamLine returns the line of a parameter (or of the closest enclosing one), else the
// plugin's line.
func (p PluginSpec) ParamLine(field string) int {
	for field != "" {
		if l, ok := p.ParamLines[field]; ok {
			return l
		}
		i := strings.LastIndexByte(field, '.')
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return p.Line
}

// SchedulingProfile lists the plugins one profile runs, with scorer weights.
type SchedulingProfile struct {
	Name    string
	Plugins []ProfilePlugin
	Line    int
}

// ProfilePlugin references a declared plugin by name.
type ProfilePlugin struct {
	PluginRef string
	Weight    *float64 // nil when not written; meaningful for scorers (llm-d: a number, GIE: an integer)
	Line      int
}

type setting struct {
	v     *Var
	value string
	line  int
}

// FileOptions are the checks a file needs from other packages.
type FileOptions struct {
	// KnownPluginTypes reports whether the picker registry knows a plugin type. Nil accepts any.
	KnownPluginTypes func(string) bool
}

// The strict shapes of the file. Lines come from a second, generic decode (see lines).
type fileYAML struct {
	APIVersion         string        `yaml:"apiVersion"`
	Kind               string        `yaml:"kind"`
	FeatureGates       []string      `yaml:"featureGates"`
	Plugins            []pluginYAML  `yaml:"plugins"`
	SchedulingProfiles []profileYAML `yaml:"schedulingProfiles"`
	Gateway            yaml.Node     `yaml:"gateway"`

	// Sections of llm-d's and GIE's EndpointPickerConfig that Tandem does not run: each is an
	// error naming its line and what Tandem does instead.
	DataLayer          yaml.Node `yaml:"dataLayer"`
	Data               yaml.Node `yaml:"data"`
	FlowControl        yaml.Node `yaml:"flowControl"`
	RequestHandler     yaml.Node `yaml:"requestHandler"`
	SaturationDetector yaml.Node `yaml:"saturationDetector"`
	Parser             yaml.Node `yaml:"parser"`
}

// unsupportedSections says, for each EndpointPickerConfig section Tandem does not take,
// what it does instead.
var unsupportedSections = []struct {
	key  string
	node func(*fileYAML) *yaml.Node
	rule string
}{
	{"dataLayer", func(f *fileYAML) *yaml.Node { return &f.DataLayer }, "is llm-d's data-layer section, which Tandem does not take: it scrapes the engines' metrics itself (AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS); remove it"},
	{"data", func(f *fileYAML) *yaml.Node { return &f.Data }, "is GIE's data-layer section, which Tandem does not take: it scrapes the engines' metrics itself (AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS); remove it"},
	{"flowControl", func(f *fileYAML) *yaml.Node { return &f.FlowControl }, "is llm-d's flow-control section, which Tandem does not take: it admits requests with its own limits (see the EPP flags); remove it"},
	{"requestHandler", func(f *fileYAML) *yaml.Node { return &f.RequestHandler }, "is llm-d's parser section, which Tandem does not take: it parses OpenAI completions and chat completions itself; remove it"},
	{"saturationDetector", func(f *fileYAML) *yaml.Node { return &f.SaturationDetector }, "is a saturation-detector section, which Tandem does not take: it sheds load with its own limits (see the EPP flags); remove it"},
	{"parser", func(f *fileYAML) *yaml.Node { return &f.Parser }, "is llm-d's parser section, which Tandem does not take: it parses OpenAI completions and chat completions itself; remove it"},
}

type pluginYAML struct {
	Type       string    `yaml:"type"`
	Name       string    `yaml:"name"`
	Parameters yaml.Node `yaml:"parameters"`
}

type profileYAML struct {
	Name    string           `yaml:"name"`
	Plugins []profileRefYAML `yaml:"plugins"`
}

type profileRefYAML struct {
	PluginRef string   `yaml:"pluginRef"`
	Weight    *float64 `yaml:"weight"`
}

// yamlWhere rewords the decoder's Go type names as places in the file.
var yamlWhere = strings.NewReplacer(
	"not found in type config.fileYAML", "is not allowed at the top level (allowed: apiVersion, kind, featureGates, plugins, schedulingProfiles, gateway)",
	"not found in type config.pluginYAML", "is not allowed in a plugins entry (allowed: type, name, parameters)",
	"not found in type config.profileYAML", "is not allowed in a schedulingProfiles entry (allowed: name, plugins)",
	"not found in type config.profileRefYAML", "is not allowed in a profile's plugins entry (allowed: pluginRef, weight)",
)

// LoadFile reads and parses the config file at path.
func LoadFile(path string, opts FileOptions) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config-file: %w", err)
	}
	return ParseFile(path, data, opts)
}

// ParseFile decodes a config file strictly (unknown fields are errors with their line) and
// validates it: plugin types, unique names, profile references, weights, and every gateway:
// setting with the same rules as its environment variable. All problems are returned at once.
func ParseFile(name string, data []byte, opts FileOptions) (*File, error) {
	var raw fileYAML
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %s", name, yamlWhere.Replace(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: line %d: a config file holds one YAML document", name, extra.Line)
	}
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root) // cannot fail: the strict decode above succeeded
	ln := lines{&root}

	f := &File{Name: name}
	var errs Errors
	bad := func(line int, field, value, rule string) {
		errs = append(errs, &Problem{File: name, Line: line, Field: field, Value: value, Rule: rule})
	}
	if raw.Kind != "" && raw.Kind != FileKind {
		bad(ln.at("kind"), "kind", raw.Kind, "must be "+FileKind)
	}
	if raw.APIVersion != "" && !slices.Contains(FileAPIVersions, raw.APIVersion) {
		bad(ln.at("apiVersion"), "apiVersion", raw.APIVersion, "must be one of "+strings.Join(FileAPIVersions, ", "))
	}
	for _, u := range unsupportedSections {
		if n := u.node(&raw); n.Kind != 0 {
			bad(ln.at(u.key), u.key, "", u.rule)
		}
	}
	for i, g := range raw.FeatureGates {
		line := ln.at("featureGates", strconv.Itoa(i))
		gate, value, hasValue := strings.Cut(strings.TrimSpace(g), "=")
		fg := FeatureGate{Name: strings.TrimSpace(gate), Enabled: true, Line: line}
		if hasValue {
			v, err := strconv.ParseBool(strings.ToLower(strings.TrimSpace(value)))
			if err != nil {
				bad(line, fmt.Sprintf("featureGates[%d]", i), g, "must be name, name=true or name=false")
				continue
			}
			fg.Enabled = v
		}
		note, known := featureGateNotes[fg.Name]
		switch {
		case !known:
			f.Warnings = append(f.Warnings, fmt.Sprintf("%s:%d: featureGates[%d]=%s: unknown feature gate, ignored (known: %s)",
				name, line, i, g, strings.Join(sortedKeys(featureGateNotes), ", ")))
		case note != "" && fg.Enabled:
			f.Warnings = append(f.Warnings, fmt.Sprintf("%s:%d: featureGates[%d]=%s: %s", name, line, i, g, note))
		}
		f.FeatureGates = append(f.FeatureGates, fg)
	}

	declared := map[string]int{} // plugin name -> line
	for i, p := range raw.Plugins {
		path := fmt.Sprintf("plugins[%d]", i)
		line := ln.at("plugins", strconv.Itoa(i))
		spec := PluginSpec{Type: p.Type, Name: p.Name, Line: line}
		if spec.Name == "" {
			spec.Name = spec.Type
		}
		switch {
		case p.Type == "":
			bad(line, path+".type", "", "is required")
		case opts.KnownPluginTypes != nil && !opts.KnownPluginTypes(p.Type):
			bad(line, path+".type", p.Type, "is not a registered plugin type")
		}
		if prev, dup := declared[spec.Name]; dup && spec.Name != "" {
			bad(line, path+".name", spec.Name, fmt.Sprintf("duplicates the plugin declared at line %d", prev))
		} else {
			declared[spec.Name] = line
		}
		params, err := parameters(&p.Parameters)
		if err != nil {
			bad(p.Parameters.Line, path+".parameters", "", err.Error())
		}
		spec.Parameters = params
		spec.ParamLines = paramLines(&p.Parameters, "", nil)
		f.Plugins = append(f.Plugins, spec)
	}

	profiles := map[string]int{}
	for i, sp := range raw.SchedulingProfiles {
		path := fmt.Sprintf("schedulingProfiles[%d]", i)
		line := ln.at("schedulingProfiles", strconv.Itoa(i))
		prof := SchedulingProfile{Name: sp.Name, Line: line}
		if sp.Name == "" {
			bad(line, path+".name", "", "is required")
		} else if prev, dup := profiles[sp.Name]; dup {
			bad(line, path+".name", sp.Name, fmt.Sprintf("duplicates the profile declared at line %d", prev))
		} else {
			profiles[sp.Name] = line
		}
		refs := map[string]bool{}
		for j, r := range sp.Plugins {
			rpath := fmt.Sprintf("%s.plugins[%d]", path, j)
			rline := ln.at("schedulingProfiles", strconv.Itoa(i), "plugins", strconv.Itoa(j))
			switch _, ok := declared[r.PluginRef]; {
			case r.PluginRef == "":
				bad(rline, rpath+".pluginRef", "", "is required")
			case !ok:
				bad(rline, rpath+".pluginRef", r.PluginRef, "names no plugin declared under plugins")
			case refs[r.PluginRef]:
				bad(rline, rpath+".pluginRef", r.PluginRef, "is listed twice in this profile")
			}
			refs[r.PluginRef] = true
			if r.Weight != nil && !(*r.Weight >= 0) {
				bad(rline, rpath+".weight", strconv.FormatFloat(*r.Weight, 'g', -1, 64), "must be 0 or more")
			}
			prof.Plugins = append(prof.Plugins, ProfilePlugin{PluginRef: r.PluginRef, Weight: r.Weight, Line: rline})
		}
		f.SchedulingProfiles = append(f.SchedulingProfiles, prof)
	}

	errs = append(errs, f.parseGateway(&raw.Gateway)...)
	if len(errs) > 0 {
		return nil, errs
	}
	return f, nil
}

// parseGateway reads the gateway: mapping; keys are the settings' Key names.
func (f *File) parseGateway(n *yaml.Node) Errors {
	var errs Errors
	bad := func(line int, field, value, rule string) {
		errs = append(errs, &Problem{File: f.Name, Line: line, Field: field, Value: value, Rule: rule})
	}
	switch n.Kind {
	case 0:
		return nil
	case yaml.MappingNode:
	default:
		if n.Tag == "!!null" {
			return nil
		}
		bad(n.Line, "gateway", n.Value, "must be a mapping of setting: value")
		return errs
	}
	seen := map[string]int{}
	scratch := DefaultGateway()
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		field := "gateway." + k.Value
		v, ok := varByKey(k.Value)
		if !ok {
			rule := "is not a gateway setting (the keys are listed in docs/configuration.md)"
			if env, isEnv := VarByName(k.Value); isEnv {
				rule = fmt.Sprintf("is not a gateway setting: %s is its environment variable; in the file the key is %s", k.Value, env.Key)
			} else if s := suggest.Nearest(k.Value, varKeys()); s != "" {
				rule = fmt.Sprintf("is not a gateway setting; did you mean %s? (the keys are listed in docs/configuration.md)", s)
			}
			bad(k.Line, field, "", rule) // no value: an unknown key may hold a secret (a password put in the wrong place)
			continue
		}
		if prev, dup := seen[k.Value]; dup {
			bad(k.Line, field, val.Value, fmt.Sprintf("is already set at line %d", prev))
			continue
		}
		seen[k.Value] = k.Line
		if val.Kind != yaml.ScalarNode || val.Tag == "!!null" {
			bad(val.Line, field, "", "needs a single value: "+v.Rule)
			continue
		}
		if reason := v.set(&scratch, val.Value); reason != "" && !v.KeepDefault {
			bad(val.Line, field, val.Value, reason)
			continue
		}
		f.settings = append(f.settings, setting{v: v, value: val.Value, line: val.Line})
	}
	return errs
}

// paramLines records the line of every key of a parameters mapping, dotted when nested.
func paramLines(n *yaml.Node, prefix string, into map[string]int) map[string]int {
	if n.Kind != yaml.MappingNode {
		return into
	}
	if into == nil {
		into = map[string]int{}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := prefix + n.Content[i].Value
		into[k] = n.Content[i].Line
		paramLines(n.Content[i+1], k+".", into)
	}
	return into
}

// parameters converts a plugin's parameters node to JSON.
func parameters(n *yaml.Node) (json.RawMessage, error) {
	if n.Kind == 0 || n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, errors.New("must be a mapping")
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("must be JSON-compatible (string keys): %v", err)
	}
	return b, nil
}

// lines finds the line of a node by a path of mapping keys and sequence indexes.
type lines struct{ root *yaml.Node }

func (l lines) at(path ...string) int {
	n := l.root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for _, p := range path {
		switch n.Kind {
		case yaml.MappingNode:
			var next *yaml.Node
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == p {
					next = n.Content[i+1]
				}
			}
			if next == nil {
				return n.Line
			}
			n = next
		case yaml.SequenceNode:
			i, err := strconv.Atoi(p)
			if err != nil || i >= len(n.Content) {
				return n.Line
			}
			n = n.Content[i]
		default:
			return n.Line
		}
	}
	return n.Line
}
