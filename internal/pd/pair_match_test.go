package pd

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

func withRevision(p pod, rev string) pod {
	p.labels = map[string]string{pool.LabelDisaggRevision: rev}
	return p
}

// A roleset mid-rollout: revision a has a prefill and a decode pod, revision b a prefill pod
// only, and the idle one. With the pair-match labels every pair is of one revision, and the
// trace names the b pod as unpaired; without them (the same pods, no match labels) the idle b
// prefill pod is paired with a's decode pod, so the check can fail. Once b's decode pod joins,
// each revision pairs within itself.
func TestRolesetsNeverPairRevisions(t *testing.T) {
	pods := []pod{withRevision(P("pa", "rs"), "a"), withRevision(D("da", "rs"), "a"), withRevision(P("pb", "rs"), "b")}
	h := newHarness(t, config.DefaultPD())
	h.match = pool.DefaultPairMatch
	h.publish(pods...)
	h.prefillInFlight("pa", 3) // pb is idle: the cheapest prefill pod, were it allowed
	for i := 0; i < 4; i++ {
		d := h.mustPick(prompt("rollout", 200))
		if d.Outcome != "pd" || d.Prefill[0].Name != "pa" || d.Destination[0].Name != "da" {
			t.Fatalf("pick %d: %s prefill %v destination %v", i, d.Outcome, names(d.Prefill), names(d.Destination))
		}
		if !slices.Contains(d.Trace.Steps, StepPairMatchUnpaired) || d.Trace.Unpaired[h.key("pb")] != "rs@"+pool.LabelDisaggRevision+"=b" {
			t.Fatalf("pick %d: trace steps %v unpaired %v", i, d.Trace.Steps, d.Trace.Unpaired)
		}
		d.Lifecycle.Done(nil)
	}

	h.match = nil
	h.publish(pods...)
	h.prefillInFlight("pa", 3)
	d := h.mustPick(prompt("a prompt no pod holds ", 200))
	if d.Prefill[0].Name != "pb" || slices.Contains(d.Trace.Steps, StepPairMatchUnpaired) {
		t.Fatalf("without match labels: prefill %v steps %v; the idle pb should win", names(d.Prefill), d.Trace.Steps)
	}
	d.Lifecycle.Done(nil)

	h.match = pool.DefaultPairMatch
	h.publish(append(pods, withRevision(D("db", "rs"), "b"))...)
	seen := map[string]bool{}
	for i := 0; i < 12; i++ {
		d := h.mustPick(prompt(fmt.Sprintf("request %d ", i), 200))
		pre, dec := d.Prefill[0], d.Destination[0]
		if pre.Revision != dec.Revision {
			t.Fatalf("pick %d paired %s (%s) with %s (%s)", i, pre.Name, pre.Revision, dec.Name, dec.Revision)
		}
		for _, e := range d.Destination[1:] {
			if e.Role == pool.RoleDecode && e.Revision != pre.Revision {
				t.Fatalf("pick %d: decode fallback %s of another revision than prefill %s", i, e.Name, pre.Name)
			}
		}
		if slices.Contains(d.Trace.Steps, StepPairMatchUnpaired) {
			t.Fatalf("pick %d: nothing is unpaired, trace %v", i, d.Trace.Steps)
		}
		seen[pre.Name+"+"+dec.Name] = true
	}
	t.Logf("pairs used: %v", seen)
}
