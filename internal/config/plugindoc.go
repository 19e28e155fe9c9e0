package config

// PluginDoc describes one plugin type for the configuration reference. The picker registry
// produces them (picker.Registry.Docs), so the reference lists exactly what a build accepts.
type PluginDoc struct {
	Type   string
	Kind   string // profile handler, filter, scorer, picker, data producer, decider
	Origin string // llm-d-router v0.10.0, GIE v1.3.1, or Tandem
	Doc    string
	Params []ParamDoc
}

// ParamDoc describes one parameter of a plugin type.
type ParamDoc struct {
	Name    string // dotted for nested objects: deciders.prefill
	Type    string
	Default string
	Doc     string
}
