package latency

import (
	"math"
	"time"
)

// The bounds of a pod's load and decode estimates.
const (
	maxRho = 0.9 // the share of a pod's time prefill work can be predicted to take
	// minDecodeSecs: no request is predicted to decode for less (a pod with no ends yet).
	minDecodeSecs = 0.5
	rhoTau        = 5.0 // seconds: time constant of the prefill-load rate
)

// pod is one endpoint's models, composed with the small types that each own one of its
// observed signals: the busy-until ledger (ledger.go), the overlap estimate (overlap.go), the
// stall detector (silence.go), the decode slack (slack.go), the iteration end groups
// (endgroup.go) and the engine sample accumulators (engine.go, fed by ingest.go). The pod
// holds the regressions (fit.go), the load rates and what joins them (backlog). Guarded by
// Models.mu.
type pod struct {
	prefill, handover, step rls
	// byDistance: the hand-over by the pair's distance class (nil until a pull's class is known).
	byDistance *classes

	ledger busyLedger

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
	prompts       enginePrompts
	ends          intervalEnds
	queue         unseenQueue
	slots         engineSlots
	// group: prefills that ended together (one iteration), fitted once it is complete.
	group endGroup
	slack decodeSlack
	// silence: the progress of the streams answering here, and the stalls it showed.
	silence silence
	// overlapEst: how much of the booked work ahead a prompt routed here waits for.
	overlapEst overlapEstimate

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
		decodeSecs: d.DecodeSeconds, uncached: 1000, ledger: busyLedger{busyUntil: now}, rhoAt: now, arrivalsAt: now, used: now,
	}
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
	ahead := q.ledger.bookedAhead(now) * q.overlap()
	allow := 0.0
	if r := q.ledger.headCharge(); r != nil {
		if late := q.ledger.lateness(r, now, q.overlap()); late > 0 {
			ahead += 2 * late
		} else {
			allow = r.service
		}
	}
	if r := q.ledger.headLeg(); r != nil {
		ahead = max(ahead, now.Sub(r.legDue).Seconds())
	}
	if q.silence.streams > 0 {
		ahead = max(ahead, q.silence.stallAhead(now, allow))
	}
	return max(ahead, 0)
}

// overlap is the share of the booked work ahead that a prompt routed here is expected to wait
// for, in [0, 1] (overlapEstimate.share).
func (q *pod) overlap() float64 { return q.overlapEst.share() }

// progress notes a chunk of one of the pod's streams at t, gap seconds after that stream's
// previous one (silence.progress). A prompt the pod prefilled meanwhile (it is still
// prefilling, or its prefill ended within the silence) explains as much of a silence as its
// predicted prefill, and a gap it may have held teaches nothing.
func (q *pod) progress(t time.Time, gap time.Duration) {
	allow := 0.0
	if r := q.ledger.headCharge(); r != nil {
		allow = r.service
	}
	if q.ledger.lastEnd.After(q.silence.progressAt) {
		allow = max(allow, q.ledger.lastService)
	}
	q.silence.progress(t, gap, allow, q.ledger.lastEnd)
}

// willDecode gives a request routed to decode here its stall budget (decodeSlack.willDecode).
func (q *pod) willDecode(life *routeLife, objective, tpot float64, maxTokens int) {
	q.slack.willDecode(life, objective, tpot, maxTokens, q.requests)
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

// addWork records prefill seconds finished at now (the load estimate and its integral).
func (q *pod) addWork(now time.Time, secs float64) {
	if secs <= 0 {
		return
	}
	q.rho = q.rhoAtNow(now) + secs/rhoTau
	q.rhoAt = now
	q.cumWork += secs
}
