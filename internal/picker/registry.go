package picker

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Factory builds a plugin instance from its name and JSON parameters. It must reject bad
// parameters with an error naming the field, the value and the rule.
type Factory func(name string, params json.RawMessage, deps *Deps) (Plugin, error)

// Registry maps plugin type names to factories. Safe for concurrent use.
type Registry struct {
	mu sync.RWMutex
	m  map[string]Factory
}

// NewRegistry returns a registry holding the built-in plugin types.
func NewRegistry() *Registry {
	r := &Registry{m: map[string]Factory{}}
	registerBuiltins(r)
	return r
}

// Register adds (or replaces) a plugin type.
func (r *Registry) Register(typ string, f Factory) {
	r.mu.Lock()
	r.m[typ] = f
	r.mu.Unlock()
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

// New builds a plugin of type typ. An unknown type is an error listing the known ones.
func (r *Registry) New(typ, name string, params json.RawMessage, deps *Deps) (Plugin, error) {
	r.mu.RLock()
	f := r.m[typ]
	r.mu.RUnlock()
	if f == nil {
		return nil, fmt.Errorf("plugin type %q is not registered; known types: %s", typ, strings.Join(r.Types(), ", "))
	}
	return f(name, params, deps)
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
