package pd

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
)

// panicPrefill is a registered prefill policy whose first Score panics (a plugin bug); it
// scores every later call 1.
type panicPrefill struct{ calls *atomic.Int64 }

func (panicPrefill) Name() string     { return "panics-once" }
func (panicPrefill) UsesPrefix() bool { return false }
func (p panicPrefill) Score(*PrefillBatch, int) float64 {
	if p.calls.Add(1) == 1 {
		panic("plugin bug")
	}
	return 1
}

// A plugin that panics inside a PD pick runs under the selection lock every PD pick of the
// process takes. The stream recovers the panic and answers 500; the lock must be released on
// the way out, or every later PD pick blocks for ever.
func TestPickAfterPanic(t *testing.T) {
	gw := gateway(func(g *config.PD) { g.PrefillScorePolicy, g.DecodeScorePolicy = "panics-once", PolicyLeastRequest })
	accepted := config.DefaultNames()
	accepted.PrefillPolicies = append(accepted.PrefillPolicies, "panics-once")
	h := newHarnessNames(t, gw, accepted, P("pA", "A"), D("dA", "A"), P("pB", "B"), D("dB", "B"))
	h.c.Policies().RegisterPrefill(panicPrefill{calls: new(atomic.Int64)})

	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the first pick did not panic: the test's plugin was not used")
			}
		}()
		_, _ = h.pick(prompt("x", 8), nil)
	}()

	done := make(chan error, 1)
	go func() {
		_, err := h.pick(prompt("y", 8), nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the pick after the panic failed: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the pick after the panic is still blocked after a minute: the selection lock was left held")
	}
}
