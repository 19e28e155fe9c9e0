package latency

import (
	"container/heap"
	"math"
	"slices"
	"time"

	"github.com/tandem-epp/tandem/internal/metrics"
)

// Defaults are the coefficients a pod starts from before Tandem observed it. They describe
// a mid-sized dense model on one modern GPU and are corrected by the first observations.
type Defaults struct {
	// Prefill: seconds = PrefillBase + PrefillPerToken·u + PrefillQuadratic·(P² − C²), for
	// a prompt of P tokens of which C are cached on the pod (u = P − C).
	PrefillBase, PrefillPerToken, PrefillQuadratic float64
	// Handover: seconds from the end of the prefill leg to the decode pod's first byte
	// (KV transfer, first decode step) = HandoverBase + HandoverPerToken·P.
	HandoverBase, HandoverPerToken float64
	// Step: one decode iteration = StepBase + StepPerRequest·n + StepPerKVToken·kv, with n
	// requests and kv KV tokens resident on the pod.
	StepBase, StepPerRequest, StepPerKVToken float64
	// DecodeSeconds is how long a request decodes, before the pod's own average is known.
	DecodeSeconds float64
}

// DefaultDefaults: 20k prompt tokens/s, attention ~ 1e-9 s per token², 3 µs/token of KV
// transfer, a 10 ms decode step growing 0.1 ms per request and 50 ms per million KV tokens.
func DefaultDefaults() Defaults {
	return Defaults{
		PrefillBase: 0.010, PrefillPerToken: 5e-5, PrefillQuadratic: 1e-9,
		HandoverBase: 0.010, HandoverPerToken: 3e-6,
		StepBase: 0.010, StepPerRequest: 1e-4, StepPerKVToken: 5e-8,
		DecodeSeconds: 5,
	}
}

// Feature scales keep the least-squares problems well conditioned: prompts of 1–100k tokens
// map to features of 0.1–10 and 0.01–100.
const (
	tokScale   = 1e4
	tok2Scale  = 1e8
	reqScale   = 64
	kvScale    = 1e6
	relNoise   = 0.2   // an observation's expected relative error (its weight is 1/(relNoise·ŷ)²)
	weightFlr  = 0.005 // seconds: below this, errors are weighed as if the prediction were this
	minService = 0.001 // seconds: no prefill is predicted faster
	minStep    = 0.001
	maxRho     = 0.9 // the share of a pod's time prefill work can be predicted to take
	// minDecodeSecs: no request is predicted to decode for less (a pod with no ends yet).
	minDecodeSecs = 0.5
	rhoTau        = 5.0 // seconds: time constant of the prefill-load rate
	clipAfter     = 5   // observations before outliers are clipped to [ŷ/4, 4ŷ]
)

func prefillX(p Prompt) [3]float64 {
	P, C := float64(p.Tokens), float64(min(max(p.Cached, 0), p.Tokens))
	return [3]float64{1, (P - C) / tokScale, (P*P - C*C) / tok2Scale}
}

func handoverX(tokens int) [3]float64 { return [3]float64{1, float64(tokens) / tokScale} }

func stepX(n, kv float64) [3]float64 { return [3]float64{1, n / reqScale, kv / kvScale} }

// Prompt is a prompt as one pod sees it: its tokens and how many of them the pod holds in
// its prefix cache.
type Prompt struct {
	Tokens, Cached int
}

// pod is one endpoint's models, ledger and observed signals. Guarded by Models.mu.
type pod struct {
	prefill, handover, step rls
	// byDistance: the hand-over by the pair's distance class (nil until a pull's class is known).
	byDistance *classes

	// The busy-until ledger: when the prefill work charged on the pod and not yet ended is
	// predicted to be done, and how many charges that is.
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

	// Prefill load: finished prefill seconds (cumulative), and an exponentially decaying
	// rate of them (prefill seconds per second, time constant rhoTau).
	cumWork float64
	rho     float64
	rhoAt   time.Time
	// arrivals is an exponentially decaying rate (per second, time constant rhoTau) of the
	// routes whose prompt or decode leg queues on the pod.
	arrivals   float64
	arrivalsAt time.Time

	// Requests Tandem routed to the pod (picked, not ended) and their KV tokens.
	requests int
	kv       float64
	// pending: routed here and no first byte yet (the engine counts them as waiting).
	pending int
	// decodeSecs is the mean time a request decodes here (first byte to end).
	decodeSecs float64
	// uncached is the mean uncached prompt tokens of the prefills charged here.
	uncached float64

	// The last scraped engine signals, and when the sample was last looked up.
	sampleAt, sampleChecked       time.Time
	engRunning, engWaiting, engKV float64
	hasEng                        bool
	directPrefill                 int // prefill ends observed by the hand-off (not inferred)
	streamSteps                   int // decode-step fits from streams Tandem routed here
	histPrefill                   int // scrapes that brought new prefill-time observations
	// booked: routes a strategy booked (Charge) with the pod as their prefill or destination.
	booked int
	// engPrefill is the prefill model of a pod no strategy books, fitted on its engine's
	// prefill-time histogram at the engine's mean prompt. Only the transfer proof reads it
	// (Models.ProofPrefill): on a decode pod that histogram is its decode legs' KV loads, so it
	// must not reach the predictions picks and the advisor use.
	engPrefill rls
	// prefillScaled: the prefill model was scaled to the engine's lifetime metrics.
	prefillScaled bool
	// promptTokens: the engine's prompt-token counter at the last sample (promptSeen: one
	// was read); ewPrompts, ewPrefills: the prompt tokens and the prefills the engine reported
	// in the intervals that saw prefills end, decayed sums (a prompt counted in one interval
	// may finish its prefill in the next: their ratio over a few intervals is the mean prompt).
	promptTokens, ewPrompts, ewPrefills float64
	promptSeen                          bool
	// endsX, endsN: the prefill features of the ends since the last sample, summed;
	// endsObserved: how many of them the prefill model was fitted on (observed or inferred).
	endsX        [3]float64
	endsN        float64
	endsObserved int
	// The engine's queue-time histogram against this replica's ledger (queueSeen): since the
	// last sample, the engine requests of Tandem's that left the engine's queue (a prefill
	// that ended, a decode leg's first byte) and the ledger's wait at each of Tandem's
	// bookings, summed.
	ownQueued, knownSum, knownN float64
	// unseenWait is the mean wait beyond the ledger's that the engine reported over the last
	// interval, when it scheduled requests Tandem did not route there (seconds; else 0).
	unseenWait float64
	// slots is how many requests the engine runs at once (max-num-seqs), learned from samples
	// that report requests waiting while the same number run (0: not known); slotRun and
	// slotSeen count the samples in a row that agree.
	slots, slotRun float64
	slotSeen       int
	// group: prefills that ended together (one iteration), fitted once it is complete.
	group endGroup
	// stallCum is the stall (seconds) prompts prefilled here imposed on its decodes so far;
	// slack the stall budgets of the requests decoding here.
	stallCum float64
	slack    slackHeap

	// Progress of the streams answering here (routes whose first byte came and that have not
	// ended): how many there are, when the last chunk of any of them came, and how far apart
	// a stream's chunks usually are (EWMA of the gap and of its absolute deviation, over
	// gapN gaps). A pod whose streams fall silent for much longer stalls: stallLen is the
	// mean length of the silences taken for stalls so far (stallN of them).
	streams         int
	progressAt      time.Time
	gapMean, gapDev float64
	gapN            int
	stallLen        float64
	stallN          int

	// How much of the booked work ahead a prompt routed here actually waits for (overlap):
	// 1 on an engine that prefills one prompt at a time, less on one that prefills many at
	// once. Each iteration's observed prefill ends (endGroup), timed from its first pick, are
	// regressed on their predicted prefill (s) and the work booked ahead of that prompt at its
	// pick (x), weighted relative to their sum; these are the decayed sums of the normal
	// equations (t the observed time), overlapN the iterations with work ahead among them. The overlap is x's coefficient over s's, so an
	// error of the prefill model, which scales both alike, does not pass for one.
	overlapSS, overlapSX, overlapXX, overlapST, overlapXT float64
	overlapN                                              int
	// overtaken: the share of recent prefill ends that came before the end of a prompt booked
	// earlier on the pod (EWMA): a queue never lets a later prompt finish first, so without
	// it the pod is not taken for one that overlaps prompts, whatever the regression says.
	// overtakenHead is the oldest outstanding charge when a later one ended first, at
	// overtakenAt (it overtook if the head ends more than an iteration later).
	overtaken     float64
	overtakes     int // overtakes seen (the gate opens after minOvertakes)
	overtakenHead *route
	overtakenAt   time.Time

	// Prediction error of TTFT on routes served here: EWMA of log(observed/predicted) and
	// of its magnitude.
	errLog, errAbs float64
	errN           int

	used time.Time
}

func newPod(d Defaults, now time.Time) *pod {
	prefill := newRLS([]float64{d.PrefillBase, d.PrefillPerToken * tokScale, d.PrefillQuadratic * tok2Scale},
		[]float64{4e-4, 0.25, 0.04})
	return &pod{
		prefill: prefill, engPrefill: prefill,
		handover: newRLS([]float64{d.HandoverBase, d.HandoverPerToken * tokScale}, []float64{4e-4, 0.01}),
		step: newRLS([]float64{d.StepBase, d.StepPerRequest * reqScale, d.StepPerKVToken * kvScale},
			[]float64{1e-4, 1e-4, 0.01}),
		decodeSecs: d.DecodeSeconds, uncached: 1000, busyUntil: now, rhoAt: now, arrivalsAt: now, used: now,
	}
}

// service is the predicted prefill seconds of p on this pod, each coefficient kept
// non-negative (a fit may wander below zero between observations).
func (q *pod) service(p Prompt) float64 { return q.serviceAt(prefillX(p)) }

func (q *pod) serviceAt(x [3]float64) float64 { return serviceOf(&q.prefill, x) }

// engService is engPrefill's prediction at x.
func (q *pod) engService(x [3]float64) float64 { return serviceOf(&q.engPrefill, x) }

// serviceOf is a prefill model's prediction at x, each coefficient kept non-negative.
func serviceOf(r *rls, x [3]float64) float64 {
	s := 0.0
	for i := 0; i < 3; i++ {
		s += max(r.theta[i], 0) * x[i]
	}
	return max(s, minService)
}

// handoverSeconds is the predicted KV transfer and first decode step for tokens.
func (q *pod) handoverSeconds(tokens int) float64 {
	x := handoverX(tokens)
	return math.Max(math.Max(q.handover.theta[0], 0)*x[0]+math.Max(q.handover.theta[1], 0)*x[1], minStep)
}

// stepSeconds is the predicted decode iteration with n requests and kv tokens resident.
func (q *pod) stepSeconds(n, kv float64) float64 {
	x := stepX(n, kv)
	s := 0.0
	for i := 0; i < 3; i++ {
		s += max(q.step.theta[i], 0) * x[i]
	}
	return max(s, minStep)
}

// backlog is the prefill work, in seconds, still ahead of a prompt arriving now. Booked
// work past due is evidence, not a debt the clock pays off: while the oldest charge's
// prefill is overdue, nothing booked behind it has started (the pod serves prompts in
// order), so the ledger moves with the clock, and the late prefill is expected to need
// about as long again as it is already late (the longer a pause has lasted, the longer it
// is likely to last). A decode pod whose hand-over is overdue is held by the same kind of
// pause, for about as long again.
//
// A pod whose streams have fallen silent is held the same way, beyond what the prompt it is
// prefilling explains (stallAhead).
func (q *pod) backlog(now time.Time) float64 {
	ahead := q.bookedAhead(now) * q.overlap()
	allow := 0.0
	if r := q.headCharge(); r != nil {
		if late := q.lateness(r, now); late > 0 {
			ahead += 2 * late
		} else {
			allow = r.service
		}
	}
	if r := q.headLeg(); r != nil {
		ahead = max(ahead, now.Sub(r.legDue).Seconds())
	}
	if q.streams > 0 {
		ahead = max(ahead, q.stallAhead(now, allow))
	}
	return max(ahead, 0)
}

// bookedAhead is the prefill work booked on the pod still ahead at now by the ledger, in
// seconds, as if the engine ran the prompts one after another.
func (q *pod) bookedAhead(now time.Time) float64 { return q.busyUntil.Sub(now).Seconds() }

// The overlap constants: the decay of a prompt's weight in the regression; the prompts with
// booked work ahead of at least minOverlapAhead seconds seen before the estimate is used.
const (
	overlapAlpha    = 0.05
	minOverlapN     = 8
	minOverlapAhead = 0.002
	// minOvertaken, minOvertakes: the share of recent ends out of booking order, and how many
	// such ends seen, from which a pod may overlap prompts (one stray end does not open it)
	minOvertaken = 0.05
	minOvertakes = 3
)

// noteEnd notes whether r's prefill, ending at t, ended in booking order: it ended before the
// oldest charge still outstanding (a later prompt first: noted, and judged when that one ends,
// ends within one iteration being one), or it is that charge (its end judges the overtake).
func (q *pod) noteEnd(t time.Time, r *route) {
	if h := q.overtakenHead; h != nil && h != r && (h.prefillDone || h.life.gone) {
		q.overtakenHead = nil // it never ended here (failed, cancelled, forgotten): nothing to judge
	}
	switch h := q.headCharge(); {
	case r == q.overtakenHead:
		late := 0.0
		if t.Sub(q.overtakenAt) > groupWindow {
			late = 1
			q.overtakes++
		}
		q.overtaken += overlapAlpha * (late - q.overtaken)
		q.overtakenHead = nil
	case h != nil && h.picked.Before(r.picked):
		if q.overtakenHead == nil {
			q.overtakenHead, q.overtakenAt = h, t
		}
	default:
		q.overtaken -= overlapAlpha * q.overtaken
	}
}

// overlap is the share of the booked work ahead that a prompt routed here is expected to wait
// for, in [0, 1]: 1 until the pod showed otherwise (a queue serving one prompt at a time), less
// on an engine that prefills prompts concurrently, so that work booked ahead delays a new one
// less than its whole length.
func (q *pod) overlap() float64 {
	if q.overlapN < minOverlapN || q.overtakes < minOvertakes || q.overtaken < minOvertaken {
		return 1
	}
	det := q.overlapSS*q.overlapXX - q.overlapSX*q.overlapSX
	if !(det > 1e-6*q.overlapSS*q.overlapXX) { // the work ahead did not vary apart from the prompts
		return 1
	}
	a := (q.overlapST*q.overlapXX - q.overlapXT*q.overlapSX) / det
	b := (q.overlapXT*q.overlapSS - q.overlapST*q.overlapSX) / det
	if !(a > 0) {
		return 1
	}
	return min(max(b/a, 0), 1)
}

// learnOverlap folds in prompts of predicted prefill s (an engine iteration's worth, which
// ended together) of which the first picked had ahead seconds of booked work before it at its
// pick and the last ended observed seconds after that pick.
func (q *pod) learnOverlap(s, ahead, observed float64) {
	if !(s > 0) || !(observed > 0) || ahead < 0 {
		return
	}
	w := 1 / ((s + ahead) * (s + ahead))
	d := 1 - overlapAlpha
	q.overlapSS = d*q.overlapSS + w*s*s
	q.overlapSX = d*q.overlapSX + w*s*ahead
	q.overlapXX = d*q.overlapXX + w*ahead*ahead
	q.overlapST = d*q.overlapST + w*s*observed
	q.overlapXT = d*q.overlapXT + w*ahead*observed
	if ahead >= minOverlapAhead {
		q.overlapN++
	}
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

// silenceLimit is how long the pod's streams may be silent before the pod is taken for
// stalled: two usual gaps, or the usual gap and four of its deviations when they vary more
// (+Inf before enough gaps were seen).
func (q *pod) silenceLimit() float64 {
	if q.gapN < minGaps {
		return math.Inf(1)
	}
	return max(silenceGaps*q.gapMean, q.gapMean+silenceDevs*q.gapDev)
}

// stallAhead is how much longer a pod whose streams have been silent since progressAt is
// predicted to stay stalled at now (0: not silent for long), allow seconds of the silence
// explained by the prompt it is prefilling (an iteration carrying its chunk is that much
// longer): a stall as long as this pod's stalls were so far, and at least as long again as
// the unexplained silence has lasted (the longer a pause has lasted, the longer it is likely
// to last).
func (q *pod) stallAhead(now time.Time, allow float64) float64 {
	silent := now.Sub(q.progressAt).Seconds() - allow
	if !(silent > q.silenceLimit()) {
		return 0
	}
	return min(max(q.stallLen, silent), maxStallAhead)
}

// maxStallAhead bounds the busy time a silence adds: past it the pod is hung rather than
// stalled (outlier detection's business), or a stream's end was never reported, and neither
// should hold the pod's predictions for longer.
const maxStallAhead = 10.0 // seconds

// progress notes a chunk of one of the pod's streams at t, gap seconds after that stream's
// previous one: a silence of the pod that outlasted its limit was a stall (its length is
// learned), and the gap teaches the pod's usual one (a stall's clipped to the limit, so that
// stalls do not make the next harder to see, and a lasting change of pace is still learned).
// A prompt the pod prefilled meanwhile (it is still prefilling, or its prefill ended within
// the silence) explains as much of a silence as its predicted prefill, and a gap it may have
// held teaches nothing.
func (q *pod) progress(t time.Time, gap time.Duration) {
	allow := 0.0
	if r := q.headCharge(); r != nil {
		allow = r.service
	}
	if q.lastEnd.After(q.progressAt) {
		allow = max(allow, q.lastService)
	}
	if silent := t.Sub(q.progressAt).Seconds() - allow; silent > q.silenceLimit() {
		if q.stallN == 0 {
			q.stallLen = silent
		} else {
			q.stallLen += stallAlpha * (silent - q.stallLen)
		}
		q.stallN++
	}
	if gap >= minGapSample && allow == 0 && !q.lastEnd.After(t.Add(-gap)) {
		g := gap.Seconds()
		g = min(g, q.silenceLimit())
		if q.gapN == 0 {
			q.gapMean = g
		}
		q.gapDev += gapAlpha * (math.Abs(g-q.gapMean) - q.gapDev)
		q.gapMean += gapAlpha * (g - q.gapMean)
		q.gapN++
	}
	if t.After(q.progressAt) {
		q.progressAt = t
	}
}

// lateness is how many seconds r's prefill, booked here, is past its due at now (negative:
// not yet due), beyond its grace.
func (q *pod) lateness(r *route, now time.Time) float64 {
	late := now.Sub(r.due).Seconds() - (q.shift - r.shiftAt)
	if k := q.overlap(); k < 1 {
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
func (q *pod) headCharge() *route {
	for len(q.outstanding) > 0 {
		if r := q.outstanding[0]; !r.prefillDone && !r.life.gone {
			return r
		}
		q.outstanding[0] = nil
		q.outstanding = q.outstanding[1:]
	}
	return nil
}

// headLeg is the oldest decode leg waiting for its first byte here (nil: none).
func (q *pod) headLeg() *route {
	for len(q.legs) > 0 {
		if r := q.legs[0]; r.firstByte.IsZero() && !r.life.gone {
			return r
		}
		q.legs[0] = nil
		q.legs = q.legs[1:]
	}
	return nil
}

// rhoAtNow is the recent prefill load (seconds of prefill per second).
func (q *pod) rhoAtNow(now time.Time) float64 {
	if q.rho == 0 { // no prefill load yet: spare the exponential
		return q.rho
	}
	return q.rho * math.Exp(-max(now.Sub(q.rhoAt).Seconds(), 0)/rhoTau)
}

// arrivalRate is the recent rate of routes queueing on the pod.
func (q *pod) arrivalRate(now time.Time) float64 {
	if q.arrivals == 0 {
		return q.arrivals
	}
	return q.arrivals * math.Exp(-max(now.Sub(q.arrivalsAt).Seconds(), 0)/rhoTau)
}

// arrived counts a route queueing on the pod at now.
func (q *pod) arrived(now time.Time) {
	q.arrivals = q.arrivalRate(now) + 1/rhoTau
	q.arrivalsAt = now
}

// charge books s seconds of prefill work at now behind what is booked already and returns
// when it is predicted to end, and the ledger's shift then. Behind overdue work it is booked
// where the ledger stands, past or not: it starts once that work ends, and the late end
// moves it with the rest.
func (q *pod) charge(now time.Time, s float64) (time.Time, float64) {
	start := q.busyUntil
	if q.charges == 0 && start.Before(now) {
		start = now
	}
	q.busyUntil = start.Add(seconds(s))
	q.charges++
	return q.busyUntil, q.shift
}

// move shifts the work booked behind a charge by d seconds (not before now).
func (q *pod) move(now time.Time, d float64) {
	to := q.busyUntil.Add(seconds(d))
	if to.Before(now) {
		to = now
	}
	q.shift += to.Sub(q.busyUntil).Seconds()
	q.busyUntil = to
}

// finish ends a charge booked with (due, shiftAt) whose prefill ended at now: the work
// booked behind it moves by the same error (the pod serves prompts in order), and an idle
// pod is free from now.
func (q *pod) finish(now, due time.Time, shiftAt float64) {
	q.charges--
	if q.charges <= 0 {
		q.charges = 0
		q.move(now, now.Sub(q.busyUntil).Seconds())
	} else {
		eff := due.Add(seconds(q.shift - shiftAt))
		q.move(now, now.Sub(eff).Seconds())
	}
	if now.After(q.lastEnd) {
		q.lastEnd = now
	}
}

// drop ends a charge of s seconds whose prefill never ran to its end (the request failed
// first): the work booked behind it moves forward by what was left of it.
func (q *pod) drop(now, due time.Time, shiftAt, s float64) {
	q.charges--
	if q.charges <= 0 {
		q.charges = 0
		q.move(now, now.Sub(q.busyUntil).Seconds())
		return
	}
	eff := due.Add(seconds(q.shift - shiftAt))
	left := math.Min(math.Max(eff.Sub(now).Seconds(), 0), s)
	q.move(now, -left)
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// addWork records prefill seconds finished at now (the load estimate and its integral).
func (q *pod) addWork(now time.Time, secs float64) {
	if secs <= 0 {
		return
	}
	q.rho = q.rhoAtNow(now) + secs/rhoTau
	q.rhoAt = now
	q.cumWork += secs
}

// fit folds an observed prefill of p into the pod's prefill model.
func (q *pod) fitPrefill(p Prompt, observed float64) {
	fitRelative(&q.prefill, prefillX(p), q.service(p), observed)
}

// fitInferred folds in a prefill whose end was only inferred (from the decode pod's
// answer): used only while the engine reports no prefill-time histogram, which is the
// better view.
func (q *pod) fitInferred(p Prompt, observed float64) {
	if q.directPrefill == 0 && q.histPrefill == 0 {
		q.fitPrefill(p, observed)
	}
}

func (q *pod) fitHandover(tokens int, observed float64) {
	fitRelative(&q.handover, handoverX(tokens), q.handoverSeconds(tokens), observed)
}

func (q *pod) fitStep(n, kv, observed float64) {
	fitRelative(&q.step, stepX(n, kv), q.stepSeconds(n, kv), observed)
}

// fitRelative updates r with y at x, weighing the residual relative to the prediction and
// clipping an outlier to [ŷ/4, 4ŷ] once the model has seen a few observations.
func fitRelative(r *rls, x [3]float64, predicted, y float64) {
	if !(y > 0) {
		return
	}
	if r.obs >= clipAfter {
		y = math.Min(math.Max(y, predicted/4), predicted*4)
	}
	scale := relNoise * math.Max(predicted, weightFlr)
	r.update(x, y, 1/(scale*scale))
}

// ingest takes a newer scraped sample: the engine's running and waiting requests and KV
// use, its prefill-time histogram (prefill model) and inter-token histogram (step model).
func (q *pod) ingest(s *metrics.Sample) {
	q.sampleAt = s.UpdatedAt
	q.hasEng = !s.Stale
	q.engRunning, q.engWaiting, q.engKV = 0, 0, 0
	if s.Stale {
		q.unseenWait = 0
		return
	}
	if s.HasRunning {
		q.engRunning = s.Running
	}
	if s.HasWaiting {
		q.engWaiting = s.Waiting
	}
	if s.HasKVUsage && s.NumGPUBlocks > 0 && s.BlockSize > 0 {
		q.engKV = s.KVUsage * float64(s.NumGPUBlocks*s.BlockSize)
	}
	q.learnSlots()
	prompts, havePrompts := 0.0, false // prompt tokens the engine took in the interval
	if s.HasPromptTokens {
		if q.promptSeen && s.PromptTokens >= q.promptTokens {
			prompts, havePrompts = s.PromptTokens-q.promptTokens, true
		}
		q.promptTokens, q.promptSeen = s.PromptTokens, true
	}
	// The engine's prefill-time histogram: the mean of the prefills it finished in the
	// scrape interval. It is the only direct view of a prefill pod's service time when a
	// decode-side sidecar runs the legs (Tandem then only infers their ends), so it is fitted
	// there, at the mean uncached prompt of the pod's recent charges; with the hand-off's
	// own observations it is not needed. A pod no strategy books (the PD policies but
	// pd-predictive) has its engPrefill fitted at the mean prompt the engine reports.
	if s.HistogramsLifetime {
		// The first scrape's means are over the engine's whole life (it may have been
		// overloaded hours ago): nothing of this interval to fit or to measure, but a better
		// start than the defaults for a pod nothing was learned about yet.
		q.startFromLifetime(s)
		q.unseenWait, q.ownQueued, q.knownSum, q.knownN = 0, 0, 0, 0
		q.endsX, q.endsN, q.endsObserved = [3]float64{}, 0, 0
		return
	}
	if mean, ok := prefillMean(s); ok {
		q.histPrefill++
		// With the hand-off's own observations it is not needed, but for an interval none of
		// whose ends could be fitted (they were booked behind work others routed there).
		if q.endsN > 0 && (q.directPrefill == 0 || q.endsObserved == 0) {
			var x [3]float64
			for i := range x {
				x[i] = q.endsX[i] / q.endsN
			}
			fitRelative(&q.prefill, x, q.serviceAt(x), mean)
		}
		if count := prefillCount(s); q.booked == 0 && havePrompts && count > 0 {
			q.ewPrompts = promptDecay*q.ewPrompts + prompts
			q.ewPrefills = promptDecay*q.ewPrefills + count
			if tokens := q.ewPrompts / q.ewPrefills; tokens >= 1 {
				x := prefillX(Prompt{Tokens: int(tokens)})
				fitRelative(&q.engPrefill, x, q.engService(x), mean)
			}
		}
	}
	// The engine's inter-token histogram: the mean gap between the tokens of the requests it
	// decoded in the interval. The streams Tandem routed here are the cleaner view (the
	// prefill work that shared the iterations is taken out of each), so it is fitted only
	// until the first of them: a pod whose traffic another replica routes, or whose answers
	// are not streamed, still learns its step. The prefill load this replica knows of is
	// taken out the same way, at the engine's running requests and KV.
	if s.HasInterTokenMean && s.InterTokenCount > 0 && s.InterTokenMean > 0 && q.streamSteps == 0 && q.engRunning > 0 {
		rho := math.Min(q.rhoAtNow(s.UpdatedAt), maxRho)
		q.fitStep(q.engRunning, q.engKV, s.InterTokenMean*(1-rho))
	}
	q.queueSeen(s)
	q.endsX, q.endsN, q.endsObserved = [3]float64{}, 0, 0
}

// The bounds of a start from an engine's lifetime histograms: the prefills (or inter-token
// gaps) they must hold, and how far they may scale the defaults either way.
const (
	minLifetimeCount = 10
	maxLifetimeScale = 20.0
)

// startFromLifetime starts a pod the models have not learned from yet, whose engine served
// requests before Tandem first scraped it, from what the engine measured rather than from the
// defaults: the prefill model scaled so that the engine's mean prompt (its prompt-token
// counter over its prefill count) takes its mean prefill, the step model so that a step at
// its running requests takes its mean inter-token gap. Only the scale changes (the form of
// the defaults stays, one mean cannot tell a per-token cost from an attention term), and the
// first observations of Tandem's own requests correct it as they would the defaults.
func (q *pod) startFromLifetime(s *metrics.Sample) {
	scale := func(r *rls, f float64) {
		f = min(max(f, 1/maxLifetimeScale), maxLifetimeScale)
		for i := range r.theta {
			r.theta[i] *= f
		}
	}
	count := prefillCount(s)
	if mean, ok := prefillMean(s); ok && mean > 0 && !math.IsInf(mean, 0) && q.prefill.obs == 0 && s.HasPromptTokens && count >= minLifetimeCount {
		if tokens := s.PromptTokens / count; tokens >= 1 {
			scale(&q.prefill, mean/q.service(Prompt{Tokens: int(tokens)}))
			q.prefillScaled = true
		}
	}
	if q.step.obs == 0 && s.HasInterTokenMean && s.InterTokenCount >= minLifetimeCount && s.InterTokenMean > 0 && !math.IsInf(s.InterTokenMean, 0) {
		scale(&q.step, s.InterTokenMean/q.stepSeconds(max(q.engRunning, 1), q.engKV))
	}
}

// slotSamples is how many samples in a row must report requests waiting while the same
// number run before that number is taken as the engine's slots.
const slotSamples = 3

// learnSlots updates the engine's slot count from the latest sample: requests waiting while
// the same number run, sample after sample, is an engine at its limit of running requests
// (vLLM's max-num-seqs); more running than that limit says it was none (the wait was for
// something else, a prefill budget or KV blocks), and it is forgotten.
func (q *pod) learnSlots() {
	if q.slots > 0 && q.engRunning > q.slots {
		q.slots, q.slotRun, q.slotSeen = 0, 0, 0
	}
	if !(q.engWaiting > 0 && q.engRunning > 0) {
		return
	}
	if q.engRunning == q.slotRun {
		q.slotSeen++
	} else {
		q.slotRun, q.slotSeen = q.engRunning, 1
	}
	if q.slotSeen >= slotSamples {
		q.slots = q.slotRun
	}
}

// slotWait is how long a request arriving now waits for a running slot: with the engine's
// slots known and more requests on the pod than slots (Tandem's, or the engine's running and
// waiting), the k-th beyond them waits for k of the running requests to end, which, each
// decoding for the pod's mean and ending evenly, is k·mean/slots. Only a pod seen decoding
// (its mean measured on streams that ended there) holds slots that long: on a pod that only
// prefills, requests waiting behind one running prompt are the prefill queue the ledger has.
func (q *pod) slotWait() float64 {
	if q.slots <= 0 || q.streamSteps == 0 {
		return 0
	}
	on := max(float64(q.requests), q.engRunning+q.engWaiting)
	return max(on+1-q.slots, 0) * q.decodeSecs / q.slots
}

// unknownWaiting is how many of the requests the engine reported waiting at its last sample
// Tandem did not route there.
func (q *pod) unknownWaiting() float64 {
	return max(q.engWaiting-float64(max(q.charges, q.pending)), 0)
}

// queueSeen compares the engine's queue-time histogram of the interval with what this
// replica's ledger knew. The engine's mean is over every request it scheduled in the
// interval, Tandem's and others', each having waited behind all the work ahead of it; the
// ledger knows Tandem's share of that work (its mean is taken at Tandem's bookings and at the
// sample). When the engine scheduled no more requests than Tandem's own that left its queue
// in the interval or may be running there, the ledger held everything they waited behind,
// and nothing is unseen: the
// histogram would only count the ledger's waits again. Otherwise the engine's mean less the
// ledger's is the wait for work others routed there.
func (q *pod) queueSeen(s *metrics.Sample) {
	knownMean := (q.knownSum + q.backlog(s.UpdatedAt)) / (q.knownN + 1)
	own := q.ownQueued
	q.ownQueued, q.knownSum, q.knownN = 0, 0, 0
	switch {
	case !s.HasQueueTimeMean:
		q.unseenWait = 0
	case !(s.QueueCount > 0):
		// Nothing left the queue: an idle pod (nothing unseen) or a stuck one (its waiting
		// requests say so; the last measure stands).
		if q.unknownWaiting() == 0 {
			q.unseenWait = 0
		}
	case s.QueueCount-own-min(float64(max(q.charges, q.pending)), q.engRunning) < unseenMinRequests:
		// Tandem's prompts the engine runs may have been scheduled in the interval (the
		// engine counted them) without having ended yet (Tandem counts them when they do).
		q.unseenWait = 0
	default:
		q.unseenWait = max(s.QueueTimeMean-knownMean, 0)
	}
}

// unseenMinRequests: an interval whose engine requests outnumber Tandem's (those that left
// the queue, and those that may be running) by fewer than this is taken as Tandem's alone.
const unseenMinRequests = 1

// prefillMean is the engine's mean prefill time over the interval: its prefill-time
// histogram's, or, for an engine that exports none (SGLang), its time to first token less
// its queue time over the same interval — what is left of the first token once the wait is
// taken out is the prefill (and the first token's step).
func prefillMean(s *metrics.Sample) (float64, bool) {
	if s.HasPrefillTimeMean {
		return s.PrefillTimeMean, s.PrefillCount > 0
	}
	if s.HasTTFTMean && s.HasQueueTimeMean && s.TTFTCount > 0 && s.QueueCount > 0 {
		mean := s.TTFTMean - s.QueueTimeMean
		return mean, mean > 0
	}
	return 0, false
}

// promptDecay weighs the previous intervals in the engine's mean prompt (ewPrompts): about ten
// intervals, enough to smooth prompts counted in one interval and prefilled in the next.
const promptDecay = 0.9

// prefillCount is how many prefills prefillMean's mean is over.
func prefillCount(s *metrics.Sample) float64 {
	if !s.HasPrefillTimeMean {
		return s.TTFTCount // the engine's prefill is its TTFT less its queue time (prefillMean)
	}
	return s.PrefillCount
}

// ended notes the features of a prefill that ended since the last sample: the engine's
// prefill-time histogram of that interval is fitted at their mean.
func (q *pod) ended(p Prompt) {
	x := prefillX(p)
	for i := range x {
		q.endsX[i] += x[i]
	}
	q.endsN++
}

// endGroup is prefills that ended within groupWindow of each other: an engine batches
// short prompts into one iteration, so their ends coincide and the time the pod spent on
// them is shared. The group's busy time (from the later of its first pick and the pod's
// previous end, to its last end) is split among them in proportion to their predicted
// service, which a FIFO estimate per prefill cannot do (it would give the first the
// whole iteration and the others nothing).
type endGroup struct {
	start, last time.Time
	items       []groupItem
	predicted   float64
	// The group's earliest pick and the work booked ahead of that prompt then, the hand-over
	// the last end's time includes, and whether every end in it tells the overlap (none ran
	// behind work others routed): one observation of the overlap, as one iteration's worth of
	// prompts served behind the same work.
	firstPick           time.Time
	firstAhead, lastAdj float64
	overlapUnknown      bool
}

type groupItem struct {
	prompt          Prompt
	service, adjust float64
	fit             fitKind
}

// fitKind says how an ended prefill informs the pod's prefill model.
type fitKind uint8

const (
	fitObserved fitKind = iota // its end was observed where it ran
	fitInferred                // inferred from the decode pod's answer
	fitNone                    // work Tandem did not route may have run first: its start is unknown
)

// groupWindow: ends closer than this belong to one iteration.
const groupWindow = 2 * time.Millisecond

// prefillEnded books the end of r's prefill at t on the pod: the ledger is corrected now;
// the service fit waits until t's group is complete. adjust: seconds of hand-over the
// observed time includes (an end inferred from the decode pod's answer).
func (q *pod) prefillEnded(t time.Time, r *route, fit fitKind, adjust float64) {
	if len(q.group.items) > 0 && t.Sub(q.group.last) > groupWindow {
		q.flushGroup()
	}
	// The prompt started when the prompts ahead of it ended, on an engine that serves one at a
	// time; at its pick on one that overlaps them (and in between as far as it does).
	start := laterOf(r.picked, q.lastEnd)
	if k := q.overlap(); k < 1 && q.lastEnd.After(r.picked) {
		start = r.picked.Add(seconds(k * q.lastEnd.Sub(r.picked).Seconds()))
	}
	if fit == fitObserved && !r.unseenHist {
		// Only an end observed where the prompt ran tells the engine's order (an inferred end
		// holds the hand-over too).
		q.noteEnd(t, r)
	}
	g := &q.group
	if len(g.items) == 0 {
		g.start, g.firstPick, g.firstAhead, g.overlapUnknown = start, r.picked, r.ahead, false
	} else if start.Before(g.start) {
		g.start = start
	}
	if r.picked.Before(g.firstPick) {
		g.firstPick, g.firstAhead = r.picked, r.ahead
	}
	g.last, g.lastAdj = t, adjust
	g.overlapUnknown = g.overlapUnknown || fit != fitObserved || r.unseenHist
	if r.unseenHist {
		// Work others routed ran here too: the prompt's start is not known, and the time to
		// its end would teach the prefill model their work.
		fit = fitNone
	}
	if fit != fitNone {
		q.endsObserved++
	}
	g.items = append(g.items, groupItem{prompt: r.prompt, service: r.service, adjust: adjust, fit: fit})
	g.predicted += r.service
	q.ended(r.prompt)
	q.ownQueued++
	q.finish(t, r.due, r.shiftAt)
	q.lastService = r.service
	q.addWork(t, r.service)
}

// flushGroup fits the prefill model on the ended group's share of the busy time.
func (q *pod) flushGroup() {
	g := &q.group
	busy := g.last.Sub(g.start).Seconds()
	if busy > 0 && g.predicted > 0 {
		for _, it := range g.items {
			obs := busy*it.service/g.predicted - it.adjust
			switch it.fit {
			case fitObserved:
				q.fitPrefill(it.prompt, obs)
			case fitInferred:
				q.fitInferred(it.prompt, obs)
			}
		}
	}
	if !g.overlapUnknown {
		q.learnOverlap(g.predicted, g.firstAhead, g.last.Sub(g.firstPick).Seconds()-g.lastAdj)
	}
	g.items, g.predicted = g.items[:0], 0
}

// The TPOT slack of the requests decoding on a pod. A prompt prefilled on a pod that is
// decoding stalls every decode there for about its prefill time (an iteration carrying a
// large chunk is as long as the chunk's compute). A request of o output tokens with TPOT
// objective T, decoding at step τ, absorbs (T − τ)·(o − 1) seconds of stalls before its
// mean TPOT exceeds T: short outputs absorb little. Each decoding request's budget is kept
// as budget + the pod's cumulative stall when it started decoding, so the pod's tightest
// budget now is the least such key minus the cumulative stall since.
type slackHeap []slackEntry

type slackEntry struct {
	key float64
	// life is the request's: its budget stands until the request ends. (A pointer, so that a
	// forecast reads it without looking the request up; not the route, which an entry would
	// keep alive.)
	life *routeLife
}

// routeLife says whether a routed request still runs.
type routeLife struct{ gone bool }

func (h slackHeap) Len() int           { return len(h) }
func (h slackHeap) Less(i, j int) bool { return h[i].key < h[j].key }
func (h slackHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *slackHeap) Push(x any)        { *h = append(*h, x.(slackEntry)) }
func (h *slackHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// defaultOutputTokens is assumed for a request that sets no max_tokens.
const defaultOutputTokens = 256

// willDecode gives a request routed to decode here its stall budget, from its pick: every
// prompt booked on the pod after it runs after its own prefill (the pod serves in order),
// so it stalls its decode.
func (q *pod) willDecode(life *routeLife, objective, tpot float64, maxTokens int) {
	if !(objective > 0) {
		return
	}
	if maxTokens <= 0 {
		maxTokens = defaultOutputTokens
	}
	budget := math.Max(objective-tpot, 0) * float64(max(maxTokens-1, 1))
	if n := len(q.slack); n >= 64 && n > 4*q.requests {
		// Ended requests' entries wait below a long-lived tight budget: drop them.
		q.slack = slices.DeleteFunc(q.slack, func(e slackEntry) bool { return e.life.gone })
		heap.Init(&q.slack)
	}
	heap.Push(&q.slack, slackEntry{key: budget + q.stallCum, life: life})
}

// stallRoom is the tightest stall budget left among the requests decoding on the pod
// (+Inf when none).
func (q *pod) stallRoom() float64 {
	for q.slack.Len() > 0 && q.slack[0].life.gone {
		heap.Pop(&q.slack)
	}
	if q.slack.Len() == 0 {
		return math.Inf(1)
	}
	return q.slack[0].key - q.stallCum
}
