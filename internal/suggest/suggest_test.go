package suggest

import "testing"

func TestNearest(t *testing.T) {
	known := []string{"grpc-port", "metrics-port", "v"}
	for name, want := range map[string]string{
		"grpc-prot":      "grpc-port", // two letters swapped: distance 2, within a third of 9
		"metricsport":    "metrics-port",
		"zzzz":           "",
		"u":              "v", // one letter off a one-letter name
		"grpc-portxxxxx": "",  // five extra letters: more than a third of 14
	} {
		if got := Nearest(name, known); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestRoleTypos(t *testing.T) {
	roles := []string{"prefill", "decode"}
	for v, want := range map[string]string{"prefil": "prefill", "decod": "decode", "decoder": "decode", "standard": ""} {
		if got := Nearest(v, roles); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", v, got, want)
		}
	}
}
