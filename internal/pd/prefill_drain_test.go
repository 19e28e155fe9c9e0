package pd

import (
	"context"
	"errors"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/picker"
)

// Step 0b scores prefill pods by (waiting + prealloc queues) / drain rate, so a prefill
// pod's drain rate must count the prefill legs it finished, however the leg ends. Worked by
// hand: 60 PD requests end in the last minute → pA drains 60/60 = 1 request/s; with 1
// request waiting on pA its score is 1/1 = 1, not > 1, so PD is not saturated and the
// request stays PD. Without prefill completions pA's drain is floored at 0.01/s and the
// same single waiting request scores 1/0.01 = 100 > 1: every request would overflow to the
// idle combined pod c1 (0/0.01 = 0 < 0.25) as soon as any prefill pod queued one request.
func TestPrefillLegFeedsPrefillDrain(t *testing.T) {
	cases := []struct {
		name string
		end  func(d *picker.Decision)
	}{
		{"sidecar: decode answers", func(d *picker.Decision) {
			d.Lifecycle.ResponseHeaders(200, d.Destination[0])
			d.Lifecycle.Done(nil)
		}},
		{"epp hand-off: prefill returns", func(d *picker.Decision) {
			d.Lifecycle.(PrefillObserver).PrefillDone(nil)
			d.Lifecycle.Done(nil)
		}},
		{"prefill fails", func(d *picker.Decision) {
			d.Lifecycle.(PrefillObserver).PrefillDone(errors.New("prefill 500"))
			d.Lifecycle.Done(errors.New("prefill 500"))
		}},
		{"cancelled before any response", func(d *picker.Decision) {
			d.Lifecycle.Done(context.Canceled)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, gateway(func(g *config.PD) { g.PromptLengthBucketing = true }),
				P("pA", "A"), D("dA", "A"), C("c1", ""))
			for i := range 60 {
				d := h.mustPick(prompt("x", 8))
				if d.Outcome != picker.OutcomePD {
					t.Fatalf("request %d: outcome %s step %s before any backlog", i, d.Outcome, d.Step)
				}
				tc.end(d)
				tc.end(d) // a second end changes nothing
			}
			if r := h.deps.Drain.PerSecond(h.key("pA")); r != 1 {
				t.Fatalf("prefill pod drain %v/s after 60 prefill legs in a minute, want 1", r)
			}
			h.sample("pA", metrics.Sample{Waiting: 1, HasWaiting: true})
			if d := h.mustPick(prompt("x", 8)); d.Outcome != picker.OutcomePD {
				t.Fatalf("1 waiting at 1/s (score 1, not > 1) overflowed: outcome %s step %s scores %v", d.Outcome, d.Step, d.Trace.Scores)
			}
		})
	}
}
