package app

import (
	"io"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

func TestDisaggregationWarnings(t *testing.T) {
	ep := func(name string, labels map[string]string) *pool.Endpoint {
		return pool.NewEndpoint("ns", name, "10.0.0.1", 8000, 0, labels, nil)
	}
	prefill := ep("p", map[string]string{"role-name": "prefill", "roleset-name": "g"})
	plainDecode := ep("d", map[string]string{"role-name": "decode", "roleset-name": "g"})
	llmdDecode := ep("d", map[string]string{"role-name": "decode", "roleset-name": "g", pool.LabelLLMDRole: "decode"})
	lonely := ep("x", map[string]string{"role-name": "decode", "roleset-name": "alone"})
	gw := func(handoff string) config.Gateway { g := config.DefaultGateway(); g.PD.Handoff = handoff; return g }
	cases := []struct {
		name   string
		eps    []*pool.Endpoint
		gw     config.Gateway
		client string
		want   []string // substrings, one per warning
	}{
		{"auto hand-off, plain pods: disaggregates", []*pool.Endpoint{prefill, plainDecode}, gw(config.HandoffAuto), config.ClientAuto, nil},
		{"sidecar hand-off, plain decode pod", []*pool.Endpoint{prefill, plainDecode}, gw(config.HandoffSidecar), config.ClientAuto,
			[]string{"decode pod(s) ns/d declare no routing sidecar"}},
		{"sidecar hand-off, llm-d decode pod", []*pool.Endpoint{prefill, llmdDecode}, gw(config.HandoffSidecar), config.ClientAuto, nil},
		{"destination-only gateway", []*pool.Endpoint{prefill, llmdDecode}, gw(config.HandoffAuto), config.ClientDestinationOnly,
			[]string{"serve PD requests whole"}},
		{"no complete roleset: nothing to say", []*pool.Endpoint{lonely}, gw(config.HandoffSidecar), config.ClientDestinationOnly, nil},
		// llm-d's pools have no rolesets: its disagg-profile-handler pairs any prefill pod with
		// any decode pod, so a destination-only gateway idles their prefill pods too.
		{"destination-only gateway, llm-d pool without rolesets", []*pool.Endpoint{
			ep("lp", map[string]string{pool.LabelLLMDRole: "prefill"}), ep("ld", map[string]string{pool.LabelLLMDRole: "decode"})},
			gw(config.HandoffAuto), config.ClientDestinationOnly, []string{"the 1 decode pod(s)"}},
		{"llm-d decode pods alone: nothing to say", []*pool.Endpoint{ep("ld", map[string]string{pool.LabelLLMDRole: "decode"})},
			gw(config.HandoffAuto), config.ClientDestinationOnly, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := pool.NewStore()
			got := disaggregationWarnings(s.Publish(pool.Info{Name: "p"}, tc.eps, true), tc.gw, tc.client)
			if len(got) != len(tc.want) {
				t.Fatalf("warnings %q, want %d", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q lacks %q", got[i], w)
				}
			}
		})
	}
}

// TestHelpDocumentsTheGatewayClientFlags: each flag is in --help with the reference's default,
// and a bad value stops the start naming the flag.
func TestHelpDocumentsTheGatewayClientFlags(t *testing.T) {
	checkFlagDocs(t, config.GatewayClientFlags)
	pool := writePool(t, pdPool)
	for arg, want := range map[string]string{
		"--gateway-client=nginx":      "--gateway-client=\"nginx\": must be one of auto, full, destination-only",
		"--destination-fallbacks=2":   "--destination-fallbacks=\"2\": must be one of auto, on, off",
		"--destination-only-hold=-1s": "--destination-only-hold=-1s",
	} {
		_, err := ParseFlags([]string{"--endpoints-file=" + pool, arg}, io.Discard, func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to mention %q", arg, err, want)
		}
	}
}
