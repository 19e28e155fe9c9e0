package latency

import (
	"math"
	"time"
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

// pod is one endpoint's models, composed with the small types that each own one of its
// observed signals: the busy-until ledger (ledger.go), the overlap estimate (overlap.go), the
// stall detector (silence.go), the decode slack (slack.go), the iteration end groups
// (endgroup.go) and the engine sample accumulators (engine.go, fed by ingest.go). The pod
// holds the regressions, the load rates and what joins them (backlog). Guarded by Models.mu.
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

// charge books s seconds of prefill work at now behind what is booked already and returns
// when it is predicted to end, and the ledger's shift then. Behind overdue work it is booked
// where the ledger stands, past or not: it starts once that work ends, and the late end

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
