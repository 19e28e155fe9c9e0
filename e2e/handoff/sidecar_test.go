package handoffe2e

import (
	"context"
	"testing"

	"github.com/tandem-epp/tandem/internal/sim"
)

// TestSidecarAndEPPModesGiveTheSameAnswers runs the same requests through the llm-d routing
// sidecar protocol (Tandem names the prefill pod in x-prefiller-host-port, the decode pod's
// sidecar runs the prefill leg) and through the epp hand-off (Tandem runs it). Both decode
// pods run the sidecar, so the epp run also shows the header is gone: no second prefill.
func TestSidecarAndEPPModesGiveTheSameAnswers(t *testing.T) {
	sidecar := newStack(t, stackOptions{engine: sim.EngineVLLM, sidecar: true,
		env: map[string]string{"TANDEM_PD_HANDOFF": "sidecar"}})
	epp := newStack(t, stackOptions{engine: sim.EngineVLLM, sidecar: true, env: eppEnv(nil)})
	for _, c := range clientCases {
		t.Run(c.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			var answers [2]reply
			for i, st := range []*stack{sidecar, epp} {
				st.prefill.ResetRequests()
				st.decode.ResetRequests()
				answers[i] = st.post(ctx, c.path(), c.body(), nil)
				if r := answers[i]; r.status != 200 || r.readErr != nil || r.text() == "" {
					t.Fatalf("mode %d: status %d, read error %v: %s", i, r.status, r.readErr, r.body)
				}
			}
			if a, b := answers[0].text(), answers[1].text(); a != b {
				t.Errorf("sidecar mode answered %q, epp mode %q", a, b)
			}

			// Sidecar mode: the decode pod got the client's body with the prefill target, and its
			// sidecar ran the prefill leg and then the decode leg it built.
			dec := inferences(sidecar.decode)
			if len(dec) != 2 || dec[0].Header.Get(sim.HeaderPrefiller) != sidecar.prefill.HostPort() ||
				string(dec[0].Body) != string(c.body()) || dec[1].Header.Get(sim.HeaderSidecarLeg) != "decode" {
				t.Errorf("sidecar mode: decode pod records %+v", describe(dec))
			}
			if n := len(inferences(sidecar.prefill)); n != 1 {
				t.Errorf("sidecar mode: prefill pod got %d legs, want 1", n)
			}

			// epp mode: one decode leg, no prefill target, nothing built by the sidecar.
			dec = inferences(epp.decode)
			if len(dec) != 1 || dec[0].Header.Get(sim.HeaderPrefiller) != "" || dec[0].Header.Get(sim.HeaderSidecarLeg) != "" {
				t.Errorf("epp mode: decode pod records %+v", describe(dec))
			}
			if n := len(inferences(epp.prefill)); n != 1 {
				t.Errorf("epp mode: prefill pod got %d legs, want 1", n)
			}
		})
	}
}

func describe(rs []sim.Recorded) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Path+" prefiller="+r.Header.Get(sim.HeaderPrefiller)+" sidecar="+r.Header.Get(sim.HeaderSidecarLeg)+" "+r.Text)
	}
	return out
}
