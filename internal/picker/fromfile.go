package picker

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tandem-epp/tandem/internal/config"
)

// FileRouting is what a --config-file contributes to the router.
type FileRouting struct {
	Strategies []Strategy
	// Default is the strategy the file's scheduling makes the gateway default, "" when the
	// file leaves the choice to Tandem (see FromFile).
	Default string
	// Warnings are problems that did not stop the file from loading.
	Warnings []string
}

// RanksItself is implemented by a profile handler that ranks its profiles' endpoints itself
// (the PD pair is chosen across two profiles): its profiles get no default picker.
type RanksItself interface {
	RanksItself()
}

// FromFile builds the strategies of a --config-file, as GIE and llm-d build a scheduler
// from an EndpointPickerConfig:
//   - plugins are built in file order (one naming a plugin declared further down is built
//     after it); a bad parameter is an error naming its line;
//   - with a multi-profile handler (llm-d's disagg-profile-handler, Tandem's
//     roleset-pd-profile-handler), the file is one strategy named after the handler, and it
//     becomes the gateway default;
//   - otherwise every scheduling profile is a strategy of its own name behind a
//     single-profile handler; the one named "default", or the only one, becomes the gateway
//     default (with several and none named default, they run only when named);
//   - a file without schedulingProfiles gets one, "default", with every filter, scorer and
//     picker it declares;
//   - a profile without a picker gets a max-score picker, a scorer without a weight weight 1;
//   - every data producer the file declares runs for every request of its strategies.
//
// The gateway default applies only when ROUTING_ALGORITHM is unset. Strategy names must not
// clash with taken ones.
func FromFile(f *config.File, reg *Registry, deps *Deps, taken []string) (*FileRouting, error) {
	if f == nil {
		return &FileRouting{}, nil
	}
	h := NewHandle(deps)
	for _, spec := range f.Plugins {
		h.Declare(spec.Name)
	}
	if err := buildPlugins(f, reg, h); err != nil {
		return nil, err
	}
	out := &FileRouting{Warnings: append(slices.Clone(f.Warnings), h.Warnings()...)}

	var handler ProfileHandler
	var producers []Plugin
	for _, spec := range f.Plugins {
		p := h.Plugin(spec.Name)
		if ph, ok := p.(ProfileHandler); ok {
			if handler != nil {
				return nil, fmt.Errorf("%s:%d: plugin %q is a second profile handler (the first is %q); a config file has one, as in GIE and llm-d",
					f.Name, spec.Line, spec.Name, handler.Name())
			}
			handler = ph
		}
		if _, ok := p.(DataProducer); ok {
			producers = append(producers, p)
		}
	}
	_, ranksItself := handler.(RanksItself)
	profiles, err := buildProfiles(f, h, !ranksItself)
	if err != nil {
		return nil, err
	}

	used := map[string]bool{}
	for _, t := range taken {
		used[t] = true
	}
	if handler != nil && handler.Type() != TypeSingleProfileHandler {
		name := strategyName(handler.Name())
		if used[name] {
			return nil, fmt.Errorf("%s: profile handler %q has the name of a built-in strategy (the file's strategy takes the handler's name); rename it", f.Name, handler.Name())
		}
		c, err := NewChain(name, handler, profiles, deps, producers...)
		if err != nil {
			return nil, fmt.Errorf("%s: profile handler %q: %w", f.Name, handler.Name(), err)
		}
		out.Strategies, out.Default = []Strategy{c}, c.Name()
		return out, nil
	}
	if handler == nil {
		handler = NewSingleProfileHandler()
	}
	for i, prof := range profiles {
		name := strategyName(prof.Name)
		if used[name] {
			return nil, fmt.Errorf("%s:%d: scheduling profile %q has the name of a built-in strategy or of another profile (strategy names are compared in lower case); rename it",
				f.Name, profileLine(f, i), prof.Name)
		}
		used[name] = true
		c, err := NewChain(name, handler, []*Profile{prof}, deps, producers...)
		if err != nil {
			return nil, fmt.Errorf("%s: scheduling profile %q: %w", f.Name, prof.Name, err)
		}
		out.Strategies = append(out.Strategies, c)
		if name == config.DefaultProfileName {
			out.Default = name
		}
	}
	if out.Default == "" && len(profiles) == 1 {
		out.Default = strategyName(profiles[0].Name)
	}
	if out.Default == "" && len(profiles) > 1 {
		out.Warnings = append(out.Warnings, fmt.Sprintf("%s: %d scheduling profiles and none named %q: each runs only when a request names it (routing-strategy header, model config or ROUTING_ALGORITHM)",
			f.Name, len(profiles), config.DefaultProfileName))
	}
	return out, nil
}

// strategyName is the routing strategy a file's profile (or profile handler) becomes: its name
// in lower case, because every way a request names a strategy (the routing-strategy header,
// ROUTING_ALGORITHM) is matched in lower case; a profile "Fast" would be unreachable otherwise.
func strategyName(name string) string { return strings.ToLower(name) }

// buildPlugins builds every declared plugin, retrying those that wait for another.
func buildPlugins(f *config.File, reg *Registry, h *Handle) error {
	pending := slices.Clone(f.Plugins)
	for len(pending) > 0 {
		var later []config.PluginSpec
		var waiting error
		for _, spec := range pending {
			p, err := reg.build(spec.Type, spec.Name, spec.Parameters, h)
			switch {
			case errors.Is(err, ErrNotBuilt):
				later = append(later, spec)
				if waiting == nil {
					waiting = fmt.Errorf("%s:%d: plugin %q: %w (the plugins name each other in a circle)", f.Name, spec.Line, spec.Name, err)
				}
			case err != nil:
				line := spec.Line
				var pe *ParamError
				if errors.As(err, &pe) {
					line = spec.ParamLine(pe.Field)
				}
				return fmt.Errorf("%s:%d: plugin %q: %w", f.Name, line, spec.Name, err)
			default:
				h.Add(p)
			}
		}
		if len(later) == len(pending) {
			return waiting
		}
		pending = later
	}
	return nil
}

// buildProfiles assigns each profile's plugins to their slots by what they implement.
func buildProfiles(f *config.File, h *Handle, defaultPicker bool) ([]*Profile, error) {
	specs := f.SchedulingProfiles
	if len(specs) == 0 && len(f.Plugins) > 0 {
		// GIE and llm-d: one "default" profile with every filter, scorer and picker.
		sp := config.SchedulingProfile{Name: config.DefaultProfileName}
		for _, spec := range f.Plugins {
			switch h.Plugin(spec.Name).(type) {
			case Filter, Scorer, Picker:
				sp.Plugins = append(sp.Plugins, config.ProfilePlugin{PluginRef: spec.Name, Line: spec.Line})
			}
		}
		specs = []config.SchedulingProfile{sp}
	}
	var out []*Profile
	for _, sp := range specs {
		prof := &Profile{Name: sp.Name}
		for _, ref := range sp.Plugins {
			p := h.Plugin(ref.PluginRef)
			if p == nil {
				return nil, fmt.Errorf("%s:%d: pluginRef %q is not declared under plugins", f.Name, ref.Line, ref.PluginRef)
			}
			if _, ok := p.(ProfileHandler); ok {
				return nil, fmt.Errorf("%s:%d: plugin %q is a profile handler: declare it under plugins only, a profile does not list it", f.Name, ref.Line, ref.PluginRef)
			}
			role := false
			if fl, ok := p.(Filter); ok {
				prof.Filters, role = append(prof.Filters, fl), true
			}
			if s, ok := p.(Scorer); ok {
				w := 1.0
				if ref.Weight != nil {
					w = *ref.Weight
				}
				prof.Scorers, role = append(prof.Scorers, WeightedScorer{Scorer: s, Weight: w}), true
			}
			if pk, ok := p.(Picker); ok {
				if prof.Picker != nil {
					return nil, fmt.Errorf("%s:%d: scheduling profile %q has two pickers (%q and %q); keep one", f.Name, ref.Line, sp.Name, prof.Picker.Name(), pk.Name())
				}
				prof.Picker, role = pk, true
			}
			if _, ok := p.(DataProducer); ok {
				role = true // it runs for every profile anyway
			}
			if !role {
				return nil, fmt.Errorf("%s:%d: plugin %q (type %s) has no role a scheduling profile can use (it is not a filter, scorer or picker)", f.Name, ref.Line, ref.PluginRef, p.Type())
			}
		}
		if prof.Picker == nil && defaultPicker {
			prof.Picker = NewMaxScorePicker()
		}
		out = append(out, prof)
	}
	return out, nil
}

func profileLine(f *config.File, i int) int {
	if i < len(f.SchedulingProfiles) {
		return f.SchedulingProfiles[i].Line
	}
	return 0
}
