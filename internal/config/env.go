package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tandem-epp/tandem/internal/suggest"
)

// Problem is one invalid setting: where it was written, the value, and the rule it breaks.
// Its message reads like `AIBRIX_TOKEN_LOAD_KV_WEIGHT=-1: must be positive`, prefixed with
// `file:line: ` when it came from the config file.
type Problem struct {
	File  string // config file name; "" for the environment and annotations
	Line  int    // line in File; 0 when unknown
	Field string // AIBRIX_… variable, or a path such as gateway.tokenLoadKVWeight
	Value string
	Rule  string
}

func (p *Problem) Error() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		if p.Line > 0 {
			fmt.Fprintf(&b, ":%d", p.Line)
		}
		b.WriteString(": ")
	}
	b.WriteString(p.Field)
	b.WriteString("=")
	b.WriteString(p.Value)
	b.WriteString(": ")
	b.WriteString(p.Rule)
	return b.String()
}

// Errors is every problem found at once. Its message has one problem per line.
type Errors []error

func (e Errors) Error() string {
	if len(e) == 1 {
		return e[0].Error()
	}
	lines := make([]string, len(e))
	for i, err := range e {
		lines[i] = "  " + err.Error()
	}
	return fmt.Sprintf("%d configuration problems:\n%s", len(e), strings.Join(lines, "\n"))
}

// Unwrap lets errors.As find each Problem.
func (e Errors) Unwrap() []error { return e }

func (e Errors) orNil() error {
	if len(e) == 0 {
		return nil
	}
	return e
}

// Warning is a setting that was not applied as written but does not stop the start
// (the seed's "an unknown value keeps the default").
type Warning struct {
	Field, Value, Message string
}

func (w Warning) String() string { return fmt.Sprintf("%s=%s: %s", w.Field, w.Value, w.Message) }

// FromEnv builds the gateway configuration from the defaults and the environment. getenv is
// os.Getenv in production; an empty value counts as unset. Every invalid variable is reported
// in the returned error at once.
func FromEnv(getenv func(string) string) (Gateway, []Warning, error) {
	return Load(nil, getenv)
}

// Load layers the gateway configuration: the defaults, then the config file's gateway:
// section (file may be nil), then the environment, which wins. Cross-field rules are checked
// on the result.
func Load(file *File, getenv func(string) string) (Gateway, []Warning, error) {
	g := DefaultGateway()
	var errs Errors
	var warns []Warning
	apply := func(v *Var, field, raw, fileName string, line int) {
		reason := v.set(&g, raw)
		switch {
		case reason == "":
		case v.KeepDefault:
			warns = append(warns, Warning{Field: field, Value: raw,
				Message: fmt.Sprintf("%s; keeping %s", reason, v.format(&g))})
		default:
			errs = append(errs, &Problem{File: fileName, Line: line, Field: field, Value: raw, Rule: reason})
		}
	}
	if file != nil {
		for _, s := range file.settings {
			apply(s.v, "gateway."+s.v.Key, s.value, file.Name, s.line)
		}
	}
	if getenv != nil {
		for i := range Vars {
			v := &Vars[i]
			if raw := getenv(v.Name); raw != "" {
				apply(v, v.Name, raw, "", 0)
			}
		}
	}
	errs = append(errs, g.crossCheck()...)
	return g, warns, errs.orNil()
}

// crossCheck applies the rules that involve more than one setting.
func (g *Gateway) crossCheck() Errors {
	var errs Errors
	if g.PD.BucketServe && !g.PD.PromptLengthBucketing {
		errs = append(errs, &Problem{Field: "AIBRIX_BUCKET_SERVE", Value: "true",
			Rule: "requires AIBRIX_PROMPT_LENGTH_BUCKETING=true (adaptive bucket serving plans over the prompt-length buckets); " +
				"set AIBRIX_PROMPT_LENGTH_BUCKETING=true or AIBRIX_BUCKET_SERVE=false"})
	}
	return errs
}

// FlagEnv are the TANDEM_* variables cmd/epp reads as the defaults of its flags (--redis-addr,
// --redis-password, --redis-tls), beside the gateway settings of Vars.
var FlagEnv = []string{"TANDEM_REDIS_ADDR", "TANDEM_REDIS_PASSWORD", "TANDEM_REDIS_TLS"}

// UnknownEnv lists AIBRIX_* and TANDEM_* variables in environ ("NAME=value" entries, as
// os.Environ returns them) that Tandem does not read, so a misspelt name is noticed.
func UnknownEnv(environ []string) []Warning {
	var out []Warning
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "AIBRIX_") && !strings.HasPrefix(name, "TANDEM_") {
			continue
		}
		if _, ok := VarByName(name); !ok && !slices.Contains(FlagEnv, name) {
			msg := "not a setting Tandem reads; check the spelling in docs/configuration.md"
			if s := suggest.Nearest(name, varNames()); s != "" {
				msg = "not a setting Tandem reads; did you mean " + s + "? (docs/configuration.md lists them)"
			}
			out = append(out, Warning{Field: name, Value: value, Message: msg})
		}
	}
	return out
}

func varKeys() []string {
	out := make([]string, len(Vars))
	for i := range Vars {
		out[i] = Vars[i].Key
	}
	return out
}

func varNames() []string {
	out := make([]string, len(Vars))
	for i := range Vars {
		out[i] = Vars[i].Name
	}
	return out
}
