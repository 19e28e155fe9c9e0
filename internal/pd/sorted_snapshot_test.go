package pd

import (
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
)

// The roleset handler sorts a snapshot's endpoints by role once and reuses the sorting for
// the snapshot's picks; a new snapshot is sorted anew, so a roleset that lost its decode pod
// is incomplete at the next pick, and one that gained it is complete again.
func TestSortingFollowsEachSnapshot(t *testing.T) {
	h := newHarness(t, config.DefaultPD(), P("pA", "A"), D("dA", "A"), C("std", ""))
	text := prompt("hello ", 200)
	for range 3 {
		if d := h.mustPick(text); d.Outcome != picker.OutcomePD || first(d.Destination) != "dA" || first(d.Prefill) != "pA" {
			t.Fatalf("complete roleset: %v to %v (prefill %v)", d.Outcome, names(d.Destination), names(d.Prefill))
		}
	}
	h.publish(P("pA", "A"), C("std", ""))
	if d := h.mustPick(text); d.Outcome != picker.OutcomeCombined || first(d.Destination) != "std" {
		t.Fatalf("decode pod gone: %v to %v, want the combined pod", d.Outcome, names(d.Destination))
	}
	h.publish(P("pA", "A"), D("dB", "A"), C("std", ""))
	if d := h.mustPick(text); d.Outcome != picker.OutcomePD || first(d.Destination) != "dB" {
		t.Fatalf("a new decode pod: %v to %v, want dB", d.Outcome, names(d.Destination))
	}
}
