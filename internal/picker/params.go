package picker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/tandem-epp/tandem/internal/config"
)

// ParamError is a plugin parameter that cannot be used: the field (a dotted path under
// parameters), the value given and the rule it breaks. A config file reports it at the
// line of that field.
type ParamError struct {
	Field string
	Value string // "" when the value is not the point (an unknown field)
	Rule  string
}

func (e *ParamError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("parameters.%s: %s", e.Field, e.Rule)
	}
	return fmt.Sprintf("parameters.%s=%s: %s", e.Field, e.Value, e.Rule)
}

// BadParam is the error a factory returns for a parameter value that breaks a rule.
func BadParam(field string, value any, rule string) error {
	return &ParamError{Field: field, Value: fmt.Sprint(value), Rule: rule}
}

// DecodeParams decodes a plugin's parameters strictly into into (a pointer to the plugin's
// parameters struct, holding its defaults): an unknown field, or a value of the wrong type,
// is a *ParamError naming the field. Empty or null parameters leave into as it is.
func DecodeParams(raw json.RawMessage, into any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if into == nil {
		if string(raw) == "{}" {
			return nil
		}
		var m map[string]json.RawMessage
		_ = json.Unmarshal(raw, &m)
		for k := range m {
			return &ParamError{Field: k, Rule: "is not a parameter: this plugin takes none"}
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(into)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return &ParamError{Field: te.Field, Value: "a JSON " + te.Value, Rule: "must be " + jsonKind(te.Type)}
	}
	if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		field = strings.Trim(field, `"`)
		return &ParamError{Field: field, Rule: "is not a parameter of this plugin; known: " + strings.Join(paramNames(into), ", ")}
	}
	return fmt.Errorf("parameters: %w", err)
}

// paramNames lists the top-level parameter names of a parameters struct.
func paramNames(params any) []string {
	var out []string
	for _, d := range paramDocs(params) {
		if !strings.Contains(d.Name, ".") {
			out = append(out, d.Name)
		} else if top, _, _ := strings.Cut(d.Name, "."); !slices.Contains(out, top) {
			out = append(out, top)
		}
	}
	return out
}

// paramDocs documents a parameters struct from its tags: json (the name), default, doc.
// A nested struct field documents its fields as name.field.
func paramDocs(params any) []config.ParamDoc {
	if params == nil {
		return nil
	}
	t := reflect.TypeOf(params)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return structDocs(t, "")
}

func structDocs(t reflect.Type, prefix string) []config.ParamDoc {
	var out []config.ParamDoc
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" || name == "" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			out = append(out, structDocs(ft, prefix+name+".")...)
			continue
		}
		out = append(out, config.ParamDoc{Name: prefix + name, Type: jsonKind(f.Type),
			Default: f.Tag.Get("default"), Doc: f.Tag.Get("doc")})
	}
	return out
}

// jsonKind names a Go type as a config file writes it.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.String:
		return "string"
	case reflect.Slice, reflect.Array:
		return "list of " + jsonKind(t.Elem())
	case reflect.Map, reflect.Struct:
		return "object"
	}
	return t.String()
}
