package app

import (
	"errors"
	"flag"
	"fmt"
	"github.com/tandem-epp/tandem/internal/suggest"
	"io"
	"strings"
)

// flagGroups orders epp --help: each group's flags, by prefix or name; a flag no group names
// is listed under "Other flags", so a new flag is never missing from the help.
var flagGroups = []struct {
	title string
	names []string // exact names, or prefixes ending in "-"
}{
	{"Pool source (one of --pool-name or --endpoints-file)", []string{"pool-name", "pool-namespace", "pool-group", "kubeconfig", "endpoint-target-ports", "endpoints-file", "config-file"}},
	{"Serving", []string{"grpc-port", "grpc-health-port", "metrics-port", "bind-address", "secure-serving", "cert-path", "health-checking", "grace-period", "grpc-keepalive-", "grpc-max-connection-idle"}},
	{"Gateway client", []string{"gateway-client", "destination-fallbacks", "destination-only-hold"}},
	{"Request limits", []string{"max-", "request-body-timeout", "request-headers-timeout", "trust-client-pd-fields"}},
	{"Shared state across replicas (Redis)", []string{"redis-"}},
	{"Logging", []string{"zap-"}},
	{"Debugging and tests", []string{"debug-trace-header", "conformance", "version"}},
}

func groupOf(name string) int {
	for i, g := range flagGroups {
		for _, n := range g.names {
			if name == n || (strings.HasSuffix(n, "-") && strings.HasPrefix(name, n)) {
				return i
			}
		}
	}
	return len(flagGroups)
}

// printGroupedFlags writes fs's flags in flagGroups' order, in PrintDefaults' format.
func printGroupedFlags(w io.Writer, fs *flag.FlagSet) {
	groups := make([][]*flag.Flag, len(flagGroups)+1)
	fs.VisitAll(func(f *flag.Flag) { i := groupOf(f.Name); groups[i] = append(groups[i], f) })
	for i, flags := range groups {
		if len(flags) == 0 {
			continue
		}
		title := "Other flags"
		if i < len(flagGroups) {
			title = flagGroups[i].title
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		for _, f := range flags {
			typ, usage := flag.UnquoteUsage(f)
			line := "  --" + f.Name
			if typ != "" {
				line += " " + typ
			}
			line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "[]" {
				line += fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintln(w, line)
		}
	}
}

// flagError turns a parse error into one line: the mistake, the nearest flag when the name
// looks mistyped, and where the list is (the help itself is not printed).
func flagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name = strings.TrimLeft(name, "-")
		if s := nearestFlag(fs, name); s != "" {
			return fmt.Errorf("unknown flag --%s: did you mean --%s? (epp --help lists the flags)", name, s)
		}
		return fmt.Errorf("unknown flag --%s (epp --help lists the flags)", name)
	}
	return errors.New(msg + " (epp --help lists the flags)")
}

// nearestFlag is the defined flag closest to name (suggest.Nearest), or "".
func nearestFlag(fs *flag.FlagSet, name string) string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return suggest.Nearest(name, names)
}
