package outliere2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Every decode pod of the only roleset dies (SIGKILL): both are ejected (the cap counts the
// combined pods, which serve requests too), and the combined pods take over. In the sidecar
// hand-off the pair's fallbacks already end with the combined pods, so the gateway reaches them
// even before the ejections; in the epp hand-off the decode body carries the prefill leg's
// kv_transfer_params and only decode pods of the roleset are fallbacks.
func TestRolesetDecodePodsGone(t *testing.T) {
	for _, mode := range []string{"epp", "sidecar"} {
		t.Run(mode, func(t *testing.T) {
			sidecar := mode == "sidecar"
			s := newStack(t, stackOptions{source: fileSource, env: map[string]string{"TANDEM_PD_HANDOFF": mode}},
				podSpec{name: "prefill-a", role: "prefill", roleset: "rs-a"},
				podSpec{name: "decode-a1", role: "decode", roleset: "rs-a", sidecar: sidecar},
				podSpec{name: "decode-a2", role: "decode", roleset: "rs-a", sidecar: sidecar},
				podSpec{name: "standard-1"}, podSpec{name: "standard-2"})
			l := s.startLoad(rate)
			warm(t, s, l, "decode-a1", "decode-a2")
			ejected1, ejected2 := s.watchEjection("decode-a1"), s.watchEjection("decode-a2")
			inFlight := l.inFlight()
			onPods := s.pods["decode-a1"].inFlight() + s.pods["decode-a2"].inFlight()
			killed := time.Now()
			s.pods["decode-a1"].kill()
			s.pods["decode-a2"].kill()
			time.Sleep(5 * time.Second)
			shots := l.finish()

			failed := failures(shots, killed.Add(-time.Minute), killed.Add(time.Hour))
			firstSecond := sentIn(shots, killed, killed.Add(time.Second))
			after := servedBy(shots, killed.Add(2*time.Second), killed.Add(time.Hour))
			result(t, "failed", len(failed))
			result(t, "in_flight_at_kill", inFlight)
			result(t, "in_flight_on_pods_at_kill", onPods)
			for i, at := range []time.Time{ejected1(), ejected2()} {
				if !at.IsZero() {
					result(t, fmt.Sprintf("decode_a%d_ejected_after_ms", i+1), ms(at.Sub(killed)))
				}
			}
			result(t, "served_after_2s", formatCounts(after))
			if lf := lastFailure(shots); !lf.IsZero() {
				result(t, "last_failure_after_ms", ms(lf.Sub(killed)))
			}
			for _, f := range failed {
				t.Logf("failed (sent %+dms): %s", ms(f.sent.Sub(killed)), f)
			}
			if len(failed) > inFlight+firstSecond {
				t.Errorf("%d requests failed, more than the %d in flight plus the %d of the first second", len(failed), inFlight, firstSecond)
			}
			if late := failures(shots, killed.Add(2*time.Second), killed.Add(time.Hour)); len(late) > 0 {
				t.Errorf("%d requests sent more than 2 s after the kill failed, e.g. %s", len(late), late[0])
			}
			// Every request sent from 2 s on was served (no late failures above): by the combined
			// pods, at least nine in ten of them (a loaded machine sends fewer than the 60 of 3 s).
			sentAfter := sentIn(shots, killed.Add(2*time.Second), killed.Add(time.Hour))
			if took := after["standard-1"] + after["standard-2"]; sentAfter < 20 || took*10 < sentAfter*9 {
				t.Errorf("the combined pods did not take over: %s of %d sent after 2 s", formatCounts(after), sentAfter)
			}
			for _, n := range []string{"decode-a1", "decode-a2"} {
				if !s.tandem.Health().Ejected(s.key(n)) {
					t.Errorf("%s is not ejected: %+v", n, s.tandem.Health().Status(s.key(n)))
				}
			}
			for _, n := range []string{"decode-a1", "decode-a2"} {
				result(t, n+"_readmitted_after_restart_ms", ms(s.readmitted(n)))
			}
		})
	}
}

// Every pod dies: outlier detection ejects what the cap allows and no more (one roleset stays
// whole in rotation), every request gets a clear 503, and once the pods are back (restarted on
// their ports) requests succeed again: at once on the pods still in rotation, and on the ejected
// ones after their ejection time and a good scrape.
func TestEveryPodFailing(t *testing.T) {
	s := newStack(t, stackOptions{source: fileSource}, pdPods("a", "b")...)
	l := s.startLoad(rate)
	warm(t, s, l, "decode-a", "decode-b")
	result(t, "in_flight_at_kill", l.inFlight())
	killed := time.Now()
	for _, n := range s.order {
		s.pods[n].kill()
	}
	allDead := time.Now() // a request sent before may have been on a pod as it died
	time.Sleep(4 * time.Second)
	h := s.tandem.Health()
	ejected := map[string]bool{}
	for _, n := range s.order {
		ejected[n] = h.Ejected(s.key(n))
	}
	whole := 0
	for _, rs := range []string{"a", "b"} {
		if !ejected["prefill-"+rs] && !ejected["decode-"+rs] {
			whole++
		}
	}
	restarted := time.Now()
	for _, n := range s.order {
		s.pods[n].start()
	}
	var recovered time.Time
	eventually(t, "requests to succeed again", func() (bool, string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		// Recovered: the 20 last answered requests sent after the restart all succeeded.
		ok := 0
		for i := len(l.shots) - 1; i >= 0 && ok < 20; i-- {
			sh := l.shots[i]
			if sh.done.IsZero() {
				continue
			}
			if sh.sent.Before(restarted) || !sh.ok() {
				return false, "not yet"
			}
			ok++
			recovered = sh.sent
		}
		return ok == 20, "not yet"
	})
	eventually(t, "every ejected pod to return", func() (bool, string) {
		for _, n := range s.order {
			if h.Ejected(s.key(n)) {
				return false, n + " still ejected"
			}
		}
		return true, ""
	})
	allBack := time.Now()
	time.Sleep(time.Second)
	shots := l.finish()

	failed := failures(shots, killed, restarted)
	kinds := map[string]int{}
	for _, f := range failed {
		switch {
		case f.status != 503 && f.sent.Before(allDead):
			kinds["in_flight_on_dying_pod"]++
		case f.status != 503:
			t.Errorf("a failure is not a 503: %s", f)
		case strings.Contains(f.body, "prefill request failed"):
			kinds["pd_prefill"]++
		case strings.Contains(f.body, "upstream connect error"):
			kinds["gateway_connect"]++
		case strings.Contains(f.body, "outlier detection"):
			kinds["tandem_no_healthy"]++
		default:
			t.Errorf("a 503 that does not say why: %s", f)
		}
	}
	result(t, "sent_while_down", sentIn(shots, killed, restarted))
	result(t, "failed_while_down", len(failed))
	result(t, "failures_by_kind", formatCounts(kinds))
	result(t, "ejected_while_down", formatCounts(boolCounts(ejected)))
	result(t, "rolesets_whole_in_rotation", whole)
	result(t, "recovered_after_restart_ms", ms(recovered.Sub(restarted)))
	result(t, "all_returned_after_restart_ms", ms(allBack.Sub(restarted)))
	result(t, "retries", formatCounts(map[string]int{
		"recovered":        int(s.counter("tandem_pd_prefill_retries_total", map[string]string{"result": "recovered"})),
		"failed":           int(s.counter("tandem_pd_prefill_retries_total", map[string]string{"result": "failed"})),
		"budget_exhausted": int(s.counter("tandem_pd_prefill_retries_total", map[string]string{"result": "budget_exhausted"})),
	}))
	if whole < 1 {
		t.Errorf("no roleset stayed whole in rotation: ejected %v", ejected)
	}
	if n := s.counter("tandem_outlier_ejections_overflow_total", nil); n == 0 {
		t.Error("the cap refused no ejection, yet every pod failed")
	}
	if late := failures(shots, allBack, allBack.Add(time.Hour)); len(late) > 0 {
		t.Errorf("%d requests failed once every pod was back, e.g. %s", len(late), late[0])
	}
}

func boolCounts(m map[string]bool) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if v {
			out[k] = 1
		}
	}
	return out
}
