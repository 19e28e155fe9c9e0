package outliere2e

import (
	"strings"
	"testing"
	"time"
)

// A decode pod that hangs (accepts requests, never answers; its metrics still answer): the
// gateway's upstream timeout answers its requests 504, which Tandem sees. Every request that
// meets the hung pod fails with a clean 504 within the timeout, and none else fails. Once the
// first 504s are back the pod is demoted for k recent-failure windows after k consecutive
// failures, so traffic tries it only a few more times before the fifth consecutive failure
// ejects it. Once it answers again it returns (its ejection time passed, a scrape succeeded).
func TestHangingPod(t *testing.T) {
	const upstreamTimeout = time.Second
	s := newStack(t, stackOptions{source: fileSource, upstreamTimeout: upstreamTimeout}, pdPods("a", "b")...)
	l := s.startLoad(rate)
	warm(t, s, l, "decode-a", "decode-b")
	ejectedAt := s.watchEjection("decode-b")
	before := s.pods["decode-b"].received()
	hung := time.Now()
	s.pods["decode-b"].faults(`{"hang_before_first_token":true}`)
	eventually(t, "decode-b to be ejected", func() (bool, string) { return !ejectedAt().IsZero(), "not yet" })
	onIt := s.pods["decode-b"].received() - before
	cleared := time.Now()
	s.pods["decode-b"].faults("")
	eventually(t, "decode-b to return", func() (bool, string) {
		return !s.tandem.Health().Ejected(s.key("decode-b")), "still ejected"
	})
	returned := time.Now()
	time.Sleep(2 * time.Second)
	shots := l.finish()

	failed := failures(shots, hung.Add(-time.Minute), hung.Add(time.Hour))
	var firstBack time.Time
	for _, f := range failed {
		if firstBack.IsZero() || f.done.Before(firstBack) {
			firstBack = f.done
		}
	}
	afterFirst := failures(shots, firstBack, hung.Add(time.Hour))
	result(t, "failed", len(failed))
	result(t, "requests_on_hung_pod", onIt)
	result(t, "failed_after_first_timeout_returned", len(afterFirst))
	result(t, "ejected_after_ms", ms(ejectedAt().Sub(hung)))
	result(t, "last_failure_after_ms", ms(lastFailure(shots).Sub(hung)))
	result(t, "returned_after_clear_ms", ms(returned.Sub(cleared)))
	for _, f := range failed {
		t.Logf("failed (sent %+dms, answered after %dms): %s", ms(f.sent.Sub(hung)), ms(f.done.Sub(f.sent)), f)
		if f.status != 504 || !strings.Contains(f.body, "upstream request timeout") || f.done.Sub(f.sent) > upstreamTimeout+time.Second {
			t.Errorf("a failure is not the gateway's prompt 504: %s", f)
		}
	}
	if len(failed) > onIt {
		t.Errorf("%d requests failed, more than the %d the hung pod received", len(failed), onIt)
	}
	// consecutive_gateway_failure (5) ejects it; the demotion spaces out the tries before.
	if len(afterFirst) > 5 {
		t.Errorf("%d requests sent after the first timeout came back failed, want at most 5", len(afterFirst))
	}
	if back := servedBy(shots, returned, returned.Add(time.Hour)); back["decode-b"] == 0 {
		t.Errorf("decode-b served nothing after it returned: %s", formatCounts(back))
	}
}

// A decode pod that answers 500 to every request: each failure demotes it (failing fast is
// not idleness; k consecutive failures demote it for k recent-failure windows), so after the
// requests already on it, traffic tries it only now and then, and the fifth consecutive 500
// ejects it. At most five fail besides those in flight when it turned sick.
func TestPodAnswering500(t *testing.T) {
	s := newStack(t, stackOptions{source: fileSource}, pdPods("a", "b")...)
	l := s.startLoad(rate)
	warm(t, s, l, "decode-a", "decode-b")
	ejectedAt := s.watchEjection("decode-b")
	inFlight := l.inFlight()
	onPod := s.pods["decode-b"].inFlight()
	sick := time.Now()
	s.pods["decode-b"].faults(`{"error_rate":1,"error_status":500}`)
	eventually(t, "decode-b to be ejected", func() (bool, string) { return !ejectedAt().IsZero(), "not yet" })
	ejected := ejectedAt()
	time.Sleep(2 * time.Second) // it stays out: its ejection lasts 3 s
	shots := l.finish()

	failed := failures(shots, sick.Add(-time.Minute), sick.Add(time.Hour))
	result(t, "failed", len(failed))
	result(t, "in_flight_at_fault", inFlight)
	result(t, "in_flight_on_pod_at_fault", onPod)
	result(t, "ejected_after_ms", ms(ejected.Sub(sick)))
	if lf := lastFailure(shots); !lf.IsZero() {
		result(t, "last_failure_after_ms", ms(lf.Sub(sick)))
	}
	for _, f := range failed {
		t.Logf("failed (sent %+dms): %s", ms(f.sent.Sub(sick)), f)
	}
	if len(failed) > 5+inFlight {
		t.Errorf("%d requests failed, want at most the 5 that eject the pod and the %d in flight", len(failed), inFlight)
	}
	if late := failures(shots, ejected, ejected.Add(time.Hour)); len(late) > 0 {
		t.Errorf("%d requests sent after the ejection failed, e.g. %s", len(late), late[0])
	}
	if st := s.tandem.Health().Status(s.key("decode-b")); !st.Ejected || st.Reason != "consecutive_5xx" {
		t.Errorf("decode-b: %+v, want ejected for consecutive_5xx", st)
	}
	// Cured: it returns once its ejection time passed and a scrape succeeded.
	cured := time.Now()
	s.pods["decode-b"].faults("")
	eventually(t, "decode-b to return", func() (bool, string) {
		return !s.tandem.Health().Ejected(s.key("decode-b")), "still ejected"
	})
	result(t, "readmitted_after_cure_ms", ms(time.Since(cured)))
}

// A pod that flaps: the decode pod crash-loops (SIGKILL, restarted on its port a second later,
// killed again a second after it is back in rotation). Each crash ejects it at once (its port
// refuses the scrape) and costs only the requests on it; each return needs its ejection time
// and a good scrape; and as it stays in rotation for less than an interval (5 s here) between
// crashes, no ejection is forgiven, so each lasts longer than the one before (2 s, 4 s, 6 s).
func TestFlappingPod(t *testing.T) {
	s := newStack(t, stackOptions{source: fileSource, env: map[string]string{
		"TANDEM_OUTLIER_INTERVAL_MS": "5000", "TANDEM_OUTLIER_BASE_EJECTION_TIME_MS": "2000"}}, pdPods("a", "b")...)
	l := s.startLoad(rate)
	warm(t, s, l, "decode-a", "decode-b")
	start := time.Now()
	var inFlight, crashes int
	var ejectedFor, back []time.Duration
	key := s.key("decode-b")
	for range 3 {
		result(t, "in_flight_on_pod_at_crash", s.pods["decode-b"].inFlight())
		inFlight += l.inFlight()
		crashes++
		s.pods["decode-b"].kill()
		eventually(t, "decode-b to be ejected", func() (bool, string) { return s.tandem.Health().Ejected(key), "not yet" })
		ejectedFor = append(ejectedFor, time.Until(s.tandem.Health().Status(key).Until).Round(100*time.Millisecond))
		time.Sleep(time.Second)
		s.pods["decode-b"].start()
		restarted := time.Now()
		eventually(t, "decode-b to return", func() (bool, string) { return !s.tandem.Health().Ejected(key), "still ejected" })
		back = append(back, time.Since(restarted).Round(10*time.Millisecond))
		time.Sleep(time.Second)
	}
	shots := l.finish()

	failed := failures(shots, start.Add(-time.Minute), start.Add(time.Hour))
	ejections := s.counter("tandem_outlier_ejections_total", map[string]string{"pod_name": "decode-b"})
	result(t, "failed", len(failed))
	result(t, "crashes", crashes)
	result(t, "in_flight_at_crashes", inFlight)
	result(t, "ejections", ejections)
	result(t, "ejection_times", ejectedFor)
	result(t, "returned_after_restart", back)
	for _, f := range failed {
		t.Logf("failed (sent %+dms): %s", ms(f.sent.Sub(start)), f)
	}
	if len(failed) > inFlight+crashes {
		t.Errorf("%d requests failed over %d crashes, more than the %d in flight at the crashes (plus one per crash)", len(failed), crashes, inFlight)
	}
	for i := 1; i < len(ejectedFor); i++ {
		if ejectedFor[i] <= ejectedFor[i-1] {
			t.Errorf("ejection %d lasts %s, not longer than the one before (%v)", i+1, ejectedFor[i], ejectedFor)
		}
	}
	if served := servedBy(shots, start, time.Now()); served["decode-b"] == 0 {
		t.Errorf("decode-b never served between its crashes: %s", formatCounts(served))
	}
}
