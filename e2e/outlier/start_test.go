package outliere2e

import (
	"strconv"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/health"
)

// TestEnginesStartAfterTandem: Tandem starts on a pool whose engines do not listen yet (a user
// running it by hand, or a pool file written before the pods start). Their refused ports hold
// them out as not_serving_yet, never as a 30 s ejection: once the engines listen, each returns
// with its next scrape, and requests succeed within 2 s although the ejection time is 30 s.
func TestEnginesStartAfterTandem(t *testing.T) {
	env := map[string]string{"TANDEM_OUTLIER_BASE_EJECTION_TIME_MS": "30000"}
	specs := append(pdPods("a", "b"), podSpec{name: "std-0"}, podSpec{name: "std-1"})
	s := newStack(t, stackOptions{late: true, env: env}, specs...)

	eventually(t, "Tandem to see the ports refuse", func() (bool, string) {
		held := 0
		for _, n := range s.order {
			st := s.tandem.Health().Status(s.key(n))
			if st.Ejected && st.Reason != health.ReasonNotServingYet {
				t.Fatalf("%s: %+v, want not_serving_yet for a port that never answered", n, st)
			}
			if st.Ejected {
				held++
			}
		}
		return held >= 2, "held out so far: " + strconv.Itoa(held)
	})
	started := time.Now()
	for _, n := range s.order {
		s.pods[n].start()
	}
	eventually(t, "every pod to return", func() (bool, string) {
		for _, n := range s.order {
			if s.tandem.Health().Ejected(s.key(n)) {
				return false, n + " still out"
			}
		}
		return true, ""
	})
	back := time.Since(started)
	result(t, "returned_after_start_ms", ms(back))
	if back > 2*time.Second {
		t.Errorf("the pods returned %v after their engines started; their first scrape should return them (scrapes every 200 ms)", back)
	}
	l := s.startLoad(rate)
	time.Sleep(2 * time.Second)
	shots := l.finish()
	if failed := failures(shots, started, started.Add(time.Hour)); len(failed) > 0 {
		t.Errorf("%d of %d requests failed after the engines started, e.g. %s", len(failed), len(shots), failed[0])
	}
	for _, n := range s.order {
		if st := s.tandem.Health().Status(s.key(n)); st.Ejections != 0 {
			t.Errorf("%s: %d ejections counted for an engine that only started late", n, st.Ejections)
		}
	}
}
