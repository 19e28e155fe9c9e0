package pd_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
)

// An engine that stalls (a preemption, a slow KV transfer, a GPU fault) stops ending the
// prompts routed to it. pd-predictive must read the overdue work as a busy pod, not as an
// idle one whose booked work the clock paid off: once the stalled pod's prompts are past
// due, no request goes there while the other pods keep ending theirs.
func TestStalledPodIsNotChosen(t *testing.T) {
	clock := load.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	gw := config.DefaultGateway()
	gw.DefaultStrategy = pd.StrategyPredictive
	p, err := app.BuildPicker(app.PickerOptions{Clock: clock, Gateway: gw, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	snap := predictivePool(combinedProfile)
	var stuck []*picker.Decision // requests that have not ended
	// on are the pods a request was routed to (the others of a list are its fallbacks).
	on := func(d *picker.Decision) []string {
		if len(d.Prefill) > 0 {
			return []string{d.Prefill[0].Name, d.Destination[0].Name}
		}
		return []string{d.Destination[0].Name}
	}
	// first is the pod that runs a request's prompt: its prefill pod, or its destination.
	first := func(d *picker.Decision) string {
		if len(d.Prefill) > 0 {
			return d.Prefill[0].Name
		}
		return d.Destination[0].Name
	}
	// Requests arrive every 25 ms or so; their prompts are served at once and they go on
	// decoding (so the healthy pods hold more requests than the stalled one), but those
	// routed to the stalled pod: its engine stopped.
	pick := func(i int) *picker.Decision {
		text := strings.Repeat(fmt.Sprintf("prompt %d ", i), 400) // ≈ 1k tokens, no shared prefix
		d, err := p.Router.Schedule(context.Background(), completion(t, text, nil), snap, snap.Endpoints)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	serve := func(d *picker.Decision) {
		if po, ok := d.Lifecycle.(pd.PrefillObserver); ok && d.Outcome == picker.OutcomePD {
			clock.Advance(20 * time.Millisecond)
			po.PrefillDone(nil)
		}
		clock.Advance(5 * time.Millisecond)
		d.Lifecycle.ResponseHeaders(200, nil)
		d.Lifecycle.ResponseBody(16, false)
		stuck = append(stuck, d) // decoding until the test ends
	}
	d := pick(0)
	stalled := first(d) // the pod that runs the first request's prompt: its engine stalls
	stuck = append(stuck, d)
	i := 1
	clock.Advance(time.Second) // the stall lasts: its prompt is long past due
	var into []int
	for j := range 40 {
		d := pick(i + j)
		if slices.Contains(on(d), stalled) {
			into = append(into, j)
			t.Logf("pick %d: %s %s prefill %v dest %v %v", j, d.Outcome, d.Step, names(d.Prefill), names(d.Destination), d.Trace.Scores)
			stuck = append(stuck, d)
		} else {
			serve(d)
		}
		clock.Advance(25 * time.Millisecond)
	}
	if len(into) > 0 {
		t.Errorf("%d of 40 requests went to the stalled %s after its work was past due (picks %v)", len(into), stalled, into)
	}
	for _, d := range stuck {
		d.Lifecycle.Done(nil)
	}
}
