package latency

import (
	"testing"
	"time"
)

// The ledger alone: charges booked one behind the other, then ended on time, late, or
// dropped; the worked numbers are in each case's name and comment.
func TestBusyLedger(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(secs(s)) }
	type op struct {
		kind string  // charge, finish (the i-th charge), drop (the i-th charge)
		at   float64 // seconds after t0
		s    float64 // charge: seconds booked
		i    int
	}
	cases := []struct {
		name      string
		ops       []op
		busyUntil float64 // seconds after t0
		shift     float64
		charges   int
	}{
		{"two charges book one behind the other: 1 s, then 2 s to t0+3",
			[]op{{"charge", 0, 1, 0}, {"charge", 0, 2, 0}}, 3, 0, 2},
		{"an idle ledger books from now, not from its past busy-until",
			[]op{{"charge", 0, 1, 0}, {"finish", 1, 0, 0}, {"charge", 5, 1, 0}}, 6, 0, 1},
		{"the first ends 0.5 s late: the second moves with it to t0+3.5",
			[]op{{"charge", 0, 1, 0}, {"charge", 0, 2, 0}, {"finish", 1.5, 0, 0}}, 3.5, 0.5, 1},
		{"the first ends 0.25 s early: the second moves to t0+2.75",
			[]op{{"charge", 0, 1, 0}, {"charge", 0, 2, 0}, {"finish", 0.75, 0, 0}}, 2.75, -0.25, 1},
		{"the last ends: the pod is free from now (t0+3.5 back to t0+2, shift 0.5−1.5)",
			[]op{{"charge", 0, 1, 0}, {"charge", 0, 2, 0}, {"finish", 1.5, 0, 0}, {"finish", 2, 0, 1}}, 2, -1, 0},
		{"the middle of three (due t0+2) fails at t0+0.5: 1 s of it was left, the third moves to t0+2",
			[]op{{"charge", 0, 1, 0}, {"charge", 0, 1, 0}, {"charge", 0, 1, 0}, {"drop", 0.5, 0, 1}}, 2, -1, 2},
		{"a dropped charge already past its due moves nothing",
			[]op{{"charge", 0, 1, 0}, {"charge", 0, 1, 0}, {"drop", 1.5, 0, 0}}, 2, 0, 1},
		{"behind overdue work a charge books where the ledger stands (t0+1, past at t0+3)",
			[]op{{"charge", 0, 1, 0}, {"charge", 3, 2, 0}}, 3, 0, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var l busyLedger
			type booked struct {
				due     time.Time
				shiftAt float64
				s       float64
			}
			var bs []booked
			for _, o := range c.ops {
				switch o.kind {
				case "charge":
					due, sh := l.charge(at(o.at), o.s)
					bs = append(bs, booked{due, sh, o.s})
				case "finish":
					l.finish(at(o.at), bs[o.i].due, bs[o.i].shiftAt)
				case "drop":
					l.drop(at(o.at), bs[o.i].due, bs[o.i].shiftAt, bs[o.i].s)
				}
			}
			if got := l.busyUntil.Sub(t0).Seconds(); !near(got, c.busyUntil, 1e-9) {
				t.Errorf("busy until t0+%.4f, want t0+%.4f", got, c.busyUntil)
			}
			if !near(l.shift, c.shift, 1e-9) {
				t.Errorf("shift %.4f, want %.4f", l.shift, c.shift)
			}
			if l.charges != c.charges {
				t.Errorf("charges %d, want %d", l.charges, c.charges)
			}
		})
	}
}

// Lateness of a charge due at t0+1 (booked at shift 0, picked at t0, 1 s of service, 0.1 s
// of grace) seen at t0+2 on a ledger that moved 0.5 s since: 2 − 1 − 0.5 − 0.1 = 0.4 s on a
// queue; on a pod that overlaps half the work ahead, the 0.5 s it waited counts half:
// 2 − 0.5·0.5 − 1 − 0.1 = 0.65 s.
func TestBusyLedgerLateness(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := &route{picked: t0, due: t0.Add(secs(1)), service: 1, grace: 0.1, life: &routeLife{}}
	l := busyLedger{shift: 0.5}
	for _, c := range []struct {
		k, want float64
	}{{1, 0.4}, {0.5, 0.65}, {0, 0.9}} {
		if got := l.lateness(r, t0.Add(secs(2)), c.k); !near(got, c.want, 1e-9) {
			t.Errorf("overlap %.1f: late %.4f, want %.4f", c.k, got, c.want)
		}
	}
}

// The heads skip what ended: a charge whose prefill ended or whose request is gone, a leg
// whose first byte came.
func TestBusyLedgerHeads(t *testing.T) {
	done := &route{prefillDone: true, life: &routeLife{}}
	gone := &route{life: &routeLife{gone: true}}
	open := &route{life: &routeLife{}}
	answered := &route{firstByte: time.Unix(1, 0), life: &routeLife{}}
	l := busyLedger{outstanding: []*route{done, gone, open}, legs: []*route{answered, gone}}
	if h := l.headCharge(); h != open || len(l.outstanding) != 1 {
		t.Errorf("head charge %p (%d left), want the open one alone", h, len(l.outstanding))
	}
	if h := l.headLeg(); h != nil || len(l.legs) != 0 {
		t.Errorf("head leg %p (%d left), want none", h, len(l.legs))
	}
}
