package redisledger

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Kinds of values refused on a read (the kind label of tandem_redis_values_rejected_total).
const (
	RejectedDecodeCharge     = "decode_charge"      // a decode-ledger field (parseValue)
	RejectedSignal           = "signal"             // a request-count field (parseVector)
	RejectedPrefillBusyUntil = "prefill_busy_until" // a pd-predictive booking (parseBusyUntil)
	RejectedHeartbeat        = "heartbeat"          // a heartbeat beyond the skew allowance, counted as now + skew
	RejectedReplicas         = "replicas"           // live replicas past MaxReplicas, not read
)

// RejectedKinds lists every kind Options.Rejected is called with.
var RejectedKinds = []string{RejectedDecodeCharge, RejectedSignal, RejectedPrefillBusyUntil, RejectedHeartbeat, RejectedReplicas}

// maxPrefillAhead bounds, in seconds, how far a replica's booked prefill work on one endpoint
// may end from Redis's now, ahead or behind: no request waits an hour for its prefill, and a
// live replica rewrites or deletes its field every publish. Beyond it, or not finite, the
// value is no replica's (+Inf made every prediction infinite and every pick fail).
const maxPrefillAhead = 3600

// parseBusyUntil reads a replica's busy-until (Unix seconds on the Redis clock) at Redis's
// now rsec, and returns the seconds still ahead (negative once drained).
func parseBusyUntil(v string, rsec float64) (ahead float64, ok bool) {
	until, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(until) || math.IsInf(until, 0) {
		return 0, false
	}
	ahead = until - rsec
	if !(ahead >= -maxPrefillAhead && ahead <= maxPrefillAhead) {
		return 0, false
	}
	return ahead, true
}

// liveReplicas is the replica set as one read saw it.
type liveReplicas struct {
	now  time.Time       // Redis's clock
	live map[string]bool // the live replicas read
	// future counts heartbeats beyond the skew allowance (live: they count as now + skew);
	// unread the live replicas past the read's bound.
	future, unread int
}

// parseLive reads liveScript's reply: Redis's TIME, the number of live replicas and the
// ones read with their heartbeats (Unix ms on the Redis clock). A reply of another shape is
// an error (the read fails, as when Redis does not answer).
func parseLive(reply any, skew time.Duration) (liveReplicas, error) {
	r, ok := reply.([]any)
	if !ok || len(r) != 4 {
		return liveReplicas{}, fmt.Errorf("replica set: unexpected reply %T", reply)
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(r[0]), 10, 64)
	usec, err2 := strconv.ParseInt(fmt.Sprint(r[1]), 10, 64)
	n, ok3 := r[2].(int64)
	members, ok4 := r[3].([]any)
	if err1 != nil || err2 != nil || !ok3 || !ok4 || sec <= 0 || usec < 0 || usec >= 1e6 || len(members)%2 != 0 {
		return liveReplicas{}, fmt.Errorf("replica set: malformed reply %v", reply)
	}
	out := liveReplicas{now: time.Unix(sec, usec*1000), live: make(map[string]bool, len(members)/2)}
	limit := float64(out.now.Add(skew).UnixMilli())
	for i := 0; i < len(members); i += 2 {
		id, ok := members[i].(string)
		score, err := strconv.ParseFloat(fmt.Sprint(members[i+1]), 64)
		if !ok || err != nil || math.IsNaN(score) {
			return liveReplicas{}, fmt.Errorf("replica set: malformed member %v %v", members[i], members[i+1])
		}
		if score > limit {
			out.future++
		}
		out.live[id] = true
	}
	out.unread = max(int(n)-len(out.live), 0)
	return out, nil
}
