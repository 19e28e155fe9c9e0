package latency

import "math"

// The pod's three regressions (prefill, hand-over, decode step; rls.go): the defaults they
// start from, their features, their predictions with each coefficient kept non-negative, and
// the rule every observation is fitted by (fitRelative).

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
	clipAfter  = 5 // observations before outliers are clipped to [ŷ/4, 4ŷ]
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
