package app

import (
	"errors"
	"strings"
	"testing"
)

// A mistyped flag is one line that names it and the flag meant; --help is grouped.
func TestMistypedFlagIsOneLineWithASuggestion(t *testing.T) {
	for arg, want := range map[string]string{
		"--grpc-prot=9002":      "unknown flag --grpc-prot: did you mean --grpc-port?",
		"--endpoint-file=x":     "did you mean --endpoints-file?",
		"--zzzz":                "unknown flag --zzzz (epp --help lists the flags)",
		"--metrics-port=ninety": "invalid value \"ninety\" for flag -metrics-port",
	} {
		var out strings.Builder
		_, err := ParseFlags([]string{arg}, &out, func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %q, want one line containing %q", arg, err, want)
		}
		if out.Len() != 0 {
			t.Errorf("%s: printed %d bytes of help besides the error", arg, out.Len())
		}
	}
	var out strings.Builder
	if _, err := ParseFlags([]string{"--help"}, &out, func(string) string { return "" }); !errors.Is(err, ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	help := out.String()
	prev := -1
	for _, title := range []string{"Pool source", "Serving:", "Request limits:", "Logging:", "Debugging and tests:"} {
		i := strings.Index(help, "\n"+title)
		if i < 0 || i < prev {
			t.Errorf("--help lacks the group %q in order:\n%s", title, help)
		}
		prev = i
	}
	if strings.Contains(help, "Other flags:") {
		t.Errorf("a flag belongs to no group:\n%s", help[strings.Index(help, "Other flags:"):])
	}
}
