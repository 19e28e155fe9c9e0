package picker

import (
	"fmt"

	"github.com/tandem-epp/tandem/internal/config"
)

// Has reports whether a plugin type is registered (the config file's type check).
func (r *Registry) Has(typ string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.m[typ] != nil
}

// FromFile builds one strategy per scheduling profile of a --config-file: the profile's name
// becomes a routing strategy (selectable with the routing-strategy header or a model config)
// that runs its filters, its scorers with their weights (1 when unset) and its picker (a
// max-score picker when the profile names none). Names must not clash with taken ones.
func FromFile(f *config.File, reg *Registry, deps *Deps, taken []string) ([]Strategy, error) {
	if f == nil {
		return nil, nil
	}
	plugins := make(map[string]Plugin, len(f.Plugins))
	for _, spec := range f.Plugins {
		name := spec.Name
		if name == "" {
			name = spec.Type
		}
		p, err := reg.New(spec.Type, name, spec.Parameters, deps)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: plugin %q: %w", f.Name, spec.Line, name, err)
		}
		plugins[name] = p
	}
	used := map[string]bool{}
	for _, t := range taken {
		used[t] = true
	}
	var out []Strategy
	for _, sp := range f.SchedulingProfiles {
		if used[sp.Name] {
			return nil, fmt.Errorf("%s:%d: scheduling profile %q has the name of a built-in strategy; rename it", f.Name, sp.Line, sp.Name)
		}
		used[sp.Name] = true
		prof := &Profile{Name: sp.Name}
		c := &Chain{StrategyName: sp.Name, Handler: NewSingleProfileHandler(), Profiles: []*Profile{prof}, Deps: deps}
		for _, ref := range sp.Plugins {
			p := plugins[ref.PluginRef]
			if p == nil {
				return nil, fmt.Errorf("%s:%d: pluginRef %q is not declared under plugins", f.Name, ref.Line, ref.PluginRef)
			}
			role := false
			if h, ok := p.(ProfileHandler); ok {
				c.Handler, role = h, true
			}
			if fl, ok := p.(Filter); ok {
				prof.Filters, role = append(prof.Filters, fl), true
			}
			if s, ok := p.(Scorer); ok {
				w := 1.0
				if ref.Weight != nil {
					w = float64(*ref.Weight)
				}
				prof.Scorers, role = append(prof.Scorers, WeightedScorer{Scorer: s, Weight: w}), true
			}
			if pk, ok := p.(Picker); ok {
				if prof.Picker != nil {
					return nil, fmt.Errorf("%s:%d: scheduling profile %q has two pickers (%q and %q); keep one", f.Name, ref.Line, sp.Name, prof.Picker.Name(), pk.Name())
				}
				prof.Picker, role = pk, true
			}
			if pp, ok := p.(PostPick); ok {
				c.PostPicks, role = append(c.PostPicks, pp), true
			}
			if rc, ok := p.(ResponseComplete); ok {
				c.ResponseComplete, role = append(c.ResponseComplete, rc), true
			}
			if !role {
				return nil, fmt.Errorf("%s:%d: plugin %q (type %s) has no role a scheduling profile can use", f.Name, ref.Line, ref.PluginRef, p.Type())
			}
		}
		if prof.Picker == nil {
			prof.Picker = &MaxScorePicker{nameOr("", TypeMaxScorePicker), DefaultFallbacks}
		}
		out = append(out, c)
	}
	return out, nil
}
