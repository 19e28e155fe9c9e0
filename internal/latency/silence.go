package latency

import (
	"math"
	"time"
)

// silence is the stall detector of one pod, fed by the progress of the streams answering
// there (routes whose first byte came and that have not ended): how many there are, when the
// last chunk of any of them came, and how far apart a stream's chunks usually are (EWMA of
// the gap and of its absolute deviation, over gapN gaps). A pod whose streams fall silent for
// much longer stalls: stallLen is the mean length of the silences taken for stalls so far
// (stallN of them). How much of a silence the pod's prefills explain is the caller's (allow).
type silence struct {
	streams         int
	progressAt      time.Time
	gapMean, gapDev float64
	gapN            int
	stallLen        float64
	stallN          int
}

// The stream-progress constants: the EWMA weight of a chunk gap; how many usual gaps and
// deviations of silence make a stall; the gaps seen before silence is judged; the EWMA weight
// of a stall's length.
const (
	gapAlpha     = 0.05
	silenceGaps  = 2.0
	silenceDevs  = 4.0
	minGaps      = 16
	stallAlpha   = 0.2
	minGapSample = 50 * time.Microsecond // closer chunks are one write split (not a gap)
)

// started counts a stream that answers from t on: a pod that had none makes progress from t.
func (s *silence) started(t time.Time) {
	if s.streams == 0 {
		s.progressAt = t
	}
	s.streams++
}

// ended counts a stream that ended.
func (s *silence) ended() { s.streams = max(s.streams-1, 0) }

// limit is how long the pod's streams may be silent before the pod is taken for stalled: two
// usual gaps, or the usual gap and four of its deviations when they vary more (+Inf before
// enough gaps were seen).
func (s *silence) limit() float64 {
	if s.gapN < minGaps {
		return math.Inf(1)
	}
	return max(silenceGaps*s.gapMean, s.gapMean+silenceDevs*s.gapDev)
}

// stallAhead is how much longer a pod whose streams have been silent since progressAt is
// predicted to stay stalled at now (0: not silent for long), allow seconds of the silence
// explained by the prompt it is prefilling (an iteration carrying its chunk is that much
// longer): a stall as long as this pod's stalls were so far, and at least as long again as
// the unexplained silence has lasted (the longer a pause has lasted, the longer it is likely
// to last).
func (s *silence) stallAhead(now time.Time, allow float64) float64 {
	silent := now.Sub(s.progressAt).Seconds() - allow
	if !(silent > s.limit()) {
		return 0
	}
	return min(max(s.stallLen, silent), maxStallAhead)
}

// maxStallAhead bounds the busy time a silence adds: past it the pod is hung rather than
// stalled (outlier detection's business), or a stream's end was never reported, and neither
// should hold the pod's predictions for longer.
const maxStallAhead = 10.0 // seconds

// progress notes a chunk of one of the pod's streams at t, gap seconds after that stream's
// previous one: a silence of the pod that outlasted its limit was a stall (its length is
// learned), and the gap teaches the pod's usual one (a stall's clipped to the limit, so that
// stalls do not make the next harder to see, and a lasting change of pace is still learned).
// allow is how much of the silence a prompt the pod prefilled meanwhile explains, and
// lastEnd when the pod's last prefill ended: a gap it may have held teaches nothing.
func (s *silence) progress(t time.Time, gap time.Duration, allow float64, lastEnd time.Time) {
	if silent := t.Sub(s.progressAt).Seconds() - allow; silent > s.limit() {
		if s.stallN == 0 {
			s.stallLen = silent
		} else {
			s.stallLen += stallAlpha * (silent - s.stallLen)
		}
		s.stallN++
	}
	if gap >= minGapSample && allow == 0 && !lastEnd.After(t.Add(-gap)) {
		g := gap.Seconds()
		g = min(g, s.limit())
		if s.gapN == 0 {
			s.gapMean = g
		}
		s.gapDev += gapAlpha * (math.Abs(g-s.gapMean) - s.gapDev)
		s.gapMean += gapAlpha * (g - s.gapMean)
		s.gapN++
	}
	if t.After(s.progressAt) {
		s.progressAt = t
	}
}
