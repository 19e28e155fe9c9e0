package picker

import (
	"errors"
	"fmt"
)

// Handle is what a plugin factory may use besides its parameters: the process's shared
// dependencies and the plugins declared alongside it (a profile handler reaches its
// deciders by name). Plugins are built in file order; one that names a plugin declared
// further down is built again once that plugin exists.
type Handle struct {
	Deps *Deps

	plugins  map[string]Plugin
	declared map[string]bool
	warnings []string
}

// ErrNotBuilt is returned by Require for a plugin that is declared but not built yet; a
// factory returns it (wrapped) to be retried after the others.
var ErrNotBuilt = errors.New("plugin not built yet")

// NewHandle returns a handle over deps with no plugins.
func NewHandle(deps *Deps) *Handle {
	return &Handle{Deps: deps, plugins: map[string]Plugin{}, declared: map[string]bool{}}
}

// Plugin returns the plugin built under name, or nil.
func (h *Handle) Plugin(name string) Plugin { return h.plugins[name] }

// Require returns the plugin called name, ErrNotBuilt when it is declared but not built yet,
// or an error saying no plugin has that name.
func (h *Handle) Require(name string) (Plugin, error) {
	if p := h.plugins[name]; p != nil {
		return p, nil
	}
	if h.declared[name] {
		return nil, fmt.Errorf("%q: %w", name, ErrNotBuilt)
	}
	return nil, fmt.Errorf("no plugin named %q is declared under plugins", name)
}

// Add records a built plugin under its name.
func (h *Handle) Add(p Plugin) { h.plugins[p.Name()] = p }

// Declare records that a plugin called name will be built.
func (h *Handle) Declare(name string) { h.declared[name] = true }

// TypedName is the Type/Name pair every plugin embeds (GIE's name for it).
type TypedName struct{ typ, name string }

// NewTypedName returns the TypedName of a plugin of type typ called name (typ when name is
// empty).
func NewTypedName(typ, name string) TypedName {
	if name == "" {
		name = typ
	}
	return TypedName{typ, name}
}

// Type implements Plugin.
func (n TypedName) Type() string { return n.typ }

// Name implements Plugin.
func (n TypedName) Name() string { return n.name }

// Warn records a problem that does not stop the plugin from working (a parameter llm-d
// would override, a value Tandem reads differently); the file loader logs it.
func (h *Handle) Warn(format string, args ...any) {
	h.warnings = append(h.warnings, fmt.Sprintf(format, args...))
}

// Warnings returns what the factories reported with Warn.
func (h *Handle) Warnings() []string { return h.warnings }
