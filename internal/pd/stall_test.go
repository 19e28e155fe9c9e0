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
	stalled := "prefill-0"
	var stuck []*picker.Decision
	on := func(d *picker.Decision) []string { return append(names(d.Prefill), names(d.Destination)...) }
	// Requests arrive every 50 ms and are served at once, but those whose prompt runs on the
	// stalled pod: its engine stops.
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
		d.Lifecycle.ResponseHeaders(200, "")
		for range 5 {
			d.Lifecycle.ResponseBody(16, false)
		}
		d.Lifecycle.Done(nil)
	}
	i := 0
	for ; len(stuck) == 0 && i < 50; i++ {
		d := pick(i)
		if slices.Contains(on(d), stalled) {
			stuck = append(stuck, d)
		} else {
			serve(d)
		}
		clock.Advance(25 * time.Millisecond)
	}
	if len(stuck) == 0 {
		t.Fatalf("no request went to %s in %d picks", stalled, i)
	}
	clock.Advance(time.Second) // the stall lasts: its prompt is long past due
	var into []int
	for j := range 40 {
		d := pick(i + j)
		if slices.Contains(on(d), stalled) {
			into = append(into, j)
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
