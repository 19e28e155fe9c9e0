package picker

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/tandem-epp/tandem/internal/config"
)

// Factory builds a plugin instance from its name and JSON parameters. It decodes them with
// DecodeParams into the plugin's own parameters struct and rejects a bad value with a
// *ParamError naming the field, the value and the rule. It reaches other plugins, and the
// shared dependencies, through the Handle.
type Factory func(name string, params json.RawMessage, h *Handle) (Plugin, error)

// Registration describes one plugin type: how to build it, and what the configuration
// reference says about it (generated from these fields, so it cannot drift).
type Registration struct {
	Type string
	// Kind is what the plugin is, as the reference groups them: KindFilter, KindScorer, ….
	Kind string
	// Origin is where the type name and its parameters come from (OriginLLMD, OriginGIE,
	// OriginTandem); a type from llm-d or GIE keeps their parameters and semantics.
	Origin string
	// Doc says what the plugin does, for a user, in a sentence or two.
	Doc string
	// Params is the zero value of the plugin's parameters struct, nil when it takes none:
	// its json, default and doc tags document every parameter.
	Params any
	New    Factory
}

// Plugin kinds, as the reference groups them.
const (
	KindProfileHandler = "profile handler"
	KindFilter         = "filter"
	KindScorer         = "scorer"
	KindPicker         = "picker"
	KindDataProducer   = "data producer"
	KindDecider        = "decider"
)

// Origins of plugin types.
const (
	OriginLLMD   = "llm-d-router v0.10.0"
	OriginGIE    = "GIE v1.3.1"
	OriginBoth   = "llm-d-router v0.10.0, GIE v1.3.1"
	OriginTandem = "Tandem"
)

// Registry maps plugin type names to registrations. Safe for concurrent use.
type Registry struct {
	mu sync.RWMutex
	m  map[string]Registration
}

// NewRegistry returns a registry holding the picker's plugin types (the PD ones are added
// by pd.RegisterPlugins).
func NewRegistry() *Registry {
	r := &Registry{m: map[string]Registration{}}
	for _, reg := range builtins() {
		r.Register(reg)
	}
	return r
}

// Register adds (or replaces) a plugin type.
func (r *Registry) Register(reg Registration) {
	if reg.Type == "" || reg.New == nil {
		panic("picker: a Registration needs a Type and a Factory")
	}
	r.mu.Lock()
	r.m[reg.Type] = reg
	r.mu.Unlock()
}

// Has reports whether a plugin type is registered (the config file's type check).
func (r *Registry) Has(typ string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.m[typ]
	return ok
}

// Types lists the registered type names, sorted.
func (r *Registry) Types() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.m))
	for k := range r.m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// New builds a plugin of type typ on its own (no other plugins declared beside it). An
// unknown type is an error listing the known ones.
func (r *Registry) New(typ, name string, params json.RawMessage, deps *Deps) (Plugin, error) {
	return r.build(typ, name, params, NewHandle(deps))
}

func (r *Registry) build(typ, name string, params json.RawMessage, h *Handle) (Plugin, error) {
	r.mu.RLock()
	reg, ok := r.m[typ]
	r.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("plugin type %q is not registered; known types: %s", typ, strings.Join(r.Types(), ", "))
	}
	if name == "" {
		name = typ
	}
	p, err := reg.New(name, params, h)
	if err != nil {
		return nil, fmt.Errorf("plugin type %q: %w", typ, err)
	}
	return p, nil
}

// Docs describes every registered type for the configuration reference, sorted by type.
func (r *Registry) Docs() []config.PluginDoc {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]config.PluginDoc, 0, len(r.m))
	for _, reg := range r.m {
		out = append(out, config.PluginDoc{Type: reg.Type, Kind: reg.Kind, Origin: reg.Origin, Doc: reg.Doc,
			Params: paramDocs(reg.Params)})
	}
	slices.SortFunc(out, func(a, b config.PluginDoc) int { return strings.Compare(a.Type, b.Type) })
	return out
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
