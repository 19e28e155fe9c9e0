package latency

import (
	"math"
	"time"
)

// busyLedger is one pod's busy-until ledger: when the prefill work charged on the pod and not
// yet ended is predicted to be done, how many charges that is, and the charges and decode legs
// still outstanding there. It owns booking, moving and ending charges; how much of the work
// booked ahead a new prompt waits for is the overlap estimate's business (pod.backlog).
type busyLedger struct {
	// busyUntil: when the charged work is predicted done; charges: how many charges that is.
	busyUntil time.Time
	charges   int
	lastEnd   time.Time // the last prefill that ended on the pod (the FIFO service estimate)
	// lastService is the predicted prefill seconds of the last prefill that ended there.
	lastService float64
	// shift is how far corrections moved the ledger since the pod was first charged: a
	// charge's due then is its due at booking + (shift − its shift at booking).
	shift float64
	// outstanding are the charges booked here whose prefill has not ended, oldest first;
	// legs the PD routes whose prefill ended elsewhere and whose first byte here has not come,
	// in the order their prefills ended. Their heads say whether the pod is overdue.
	outstanding, legs []*route
}

// bookedAhead is the prefill work booked on the pod still ahead at now by the ledger, in
// seconds, as if the engine ran the prompts one after another.
func (l *busyLedger) bookedAhead(now time.Time) float64 { return l.busyUntil.Sub(now).Seconds() }

// lateness is how many seconds r's prefill, booked here, is past its due at now (negative:
// not yet due), beyond its grace; k is the pod's overlap (pod.overlap).
func (l *busyLedger) lateness(r *route, now time.Time, k float64) float64 {
	late := now.Sub(r.due).Seconds() - (l.shift - r.shiftAt)
	if k < 1 {
		// On an engine that overlaps prompts, r started about when it was picked, as far as
		// the pod overlaps them, not when the ledger's work ahead of it ended (prompts that
		// ended before it, out of order, moved the ledger by errors of a queue it is not).
		sincePick := now.Sub(r.picked).Seconds()
		ahead := max(sincePick-late-r.service, 0)
		late = sincePick - k*ahead - r.service
	}
	return late - r.grace
}

// headCharge is the oldest charge whose prefill has not ended (nil: none), the ended ones
// before it dropped.
func (l *busyLedger) headCharge() *route {
	for len(l.outstanding) > 0 {
		if r := l.outstanding[0]; !r.prefillDone && !r.life.gone {
			return r
		}
		l.outstanding[0] = nil
		l.outstanding = l.outstanding[1:]
	}
	return nil
}

// headLeg is the oldest decode leg waiting for its first byte here (nil: none).
func (l *busyLedger) headLeg() *route {
	for len(l.legs) > 0 {
		if r := l.legs[0]; r.firstByte.IsZero() && !r.life.gone {
			return r
		}
		l.legs[0] = nil
		l.legs = l.legs[1:]
	}
	return nil
}

// charge books s seconds of prefill work at now behind what is booked already and returns
// when it is predicted to end, and the ledger's shift then. Behind overdue work it is booked
// where the ledger stands, past or not: it starts once that work ends, and the late end
// moves it with the rest.
func (l *busyLedger) charge(now time.Time, s float64) (time.Time, float64) {
	start := l.busyUntil
	if l.charges == 0 && start.Before(now) {
		start = now
	}
	l.busyUntil = start.Add(seconds(s))
	l.charges++
	return l.busyUntil, l.shift
}

// move shifts the work booked behind a charge by d seconds (not before now).
func (l *busyLedger) move(now time.Time, d float64) {
	to := l.busyUntil.Add(seconds(d))
	if to.Before(now) {
		to = now
	}
	l.shift += to.Sub(l.busyUntil).Seconds()
	l.busyUntil = to
}

// finish ends a charge booked with (due, shiftAt) whose prefill ended at now: the work
// booked behind it moves by the same error (the pod serves prompts in order), and an idle
// pod is free from now.
func (l *busyLedger) finish(now, due time.Time, shiftAt float64) {
	l.charges--
	if l.charges <= 0 {
		l.charges = 0
		l.move(now, now.Sub(l.busyUntil).Seconds())
	} else {
		eff := due.Add(seconds(l.shift - shiftAt))
		l.move(now, now.Sub(eff).Seconds())
	}
	if now.After(l.lastEnd) {
		l.lastEnd = now
	}
}

// drop ends a charge of s seconds whose prefill never ran to its end (the request failed
// first): the work booked behind it moves forward by what was left of it.
func (l *busyLedger) drop(now, due time.Time, shiftAt, s float64) {
	l.charges--
	if l.charges <= 0 {
		l.charges = 0
		l.move(now, now.Sub(l.busyUntil).Seconds())
		return
	}
	eff := due.Add(seconds(l.shift - shiftAt))
	left := math.Min(math.Max(eff.Sub(now).Seconds(), 0), s)
	l.move(now, -left)
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
