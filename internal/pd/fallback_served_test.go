package pd

import (
	"errors"
	"sync"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
)

type prefillEnds struct {
	mu   sync.Mutex
	errs []error
}

func (p *prefillEnds) Observe(e *outcome.Event) {
	if e.Phase == outcome.PhasePrefillEnd {
		p.mu.Lock()
		p.errs = append(p.errs, e.Route.PrefillErr)
		p.mu.Unlock()
	}
}

// A pair whose decode leg the gateway sent to a combined fallback (the decode pod refused):
// the standard pod ran the whole request, so no prefill leg ran on the prefill pod and the
// outcome record says so (the latency models must not time the fallback's answer as the
// prefill pod's prefill); the request counts as running on the fallback. Served by another
// decode pod of the roleset, whose sidecar runs the leg, the prefill end is inferred as usual.
func TestPairServedByACombinedFallback(t *testing.T) {
	gw := gateway(func(g *config.PD) { g.PrefillScorePolicy, g.DecodeScorePolicy = PolicyLeastRequest, PolicyLeastRequest })
	h := newHarness(t, gw, P("pa", "a"), D("da1", "a"), D("da2", "a"), C("s1", ""))
	var ends prefillEnds
	h.deps.Outcomes.Subscribe(&ends)
	for _, c := range []struct {
		served string
		want   error
	}{{"s1", outcome.ErrPrefillNotRun}, {"decode", nil}} {
		ends.errs = nil
		d := h.mustPick(prompt("q", 20))
		if d.Outcome != picker.OutcomePD || len(d.Destination) != 3 {
			t.Fatalf("decision %s %v, want a decode pod, the other, s1", d.Outcome, names(d.Destination))
		}
		primary := d.Destination[0]
		if c.served != "s1" {
			c.served = d.Destination[1].Name // the roleset's other decode pod
		}
		d.Lifecycle.ResponseHeaders(200, h.byName[c.served])
		if n := h.deps.Running.InFlight(h.key(c.served)); n < 1 {
			t.Errorf("served by %s: not counted running there", c.served)
		}
		d.Lifecycle.Done(nil)
		if len(ends.errs) != 1 || !errors.Is(ends.errs[0], c.want) && ends.errs[0] != c.want {
			t.Errorf("served by %s: prefill ends %v, want [%v]", c.served, ends.errs, c.want)
		}
		if h.c.PrefillInFlight(h.key("pa")) != 0 || h.c.PendingDecode(primary.Key()) != 0 {
			t.Errorf("served by %s: trackers still count the pair", c.served)
		}
	}
}
