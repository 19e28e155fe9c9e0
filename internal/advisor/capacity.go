package advisor

import (
	"cmp"
	"math"
	"slices"

	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/pool"
)

// How the capacity of a split is predicted (docs/advisor.md says it in words):
//
//   - a pod that prefills shares its iterations among the prompts it holds (chunked prefill):
//     a prompt of s seconds (the fitted prefill, scaled by calibrate) takes s / (1 − load)
//     there, and meets its TTFT objective when that and its hand-over (PD) or a decode step
//     (run whole) fit in it;
//   - a pod that decodes runs iterations: a decode step (fitted on the requests and KV tokens
//     resident, by Little's law) or, when a prompt arrives there to run whole, one iteration
//     as long as its prefill that the resident decodes ride along (chunked prefill); its TPOT
//     is the mean iteration, and must stay within the TPOT objective, its resident KV within
//     the pod's KV capacity;
//   - the router sends the prompts above a length to the pairs and the rest to run whole on
//     the standard pods first, then on the decode pods' room left (pd-predictive's selective
//     disaggregation); a split's capacity is the highest rate of the window's mix it serves
//     at the best such length.

// request is one completed request's size: its prompt tokens, those of them the pod that
// prefilled it held in its prefix cache, its output tokens.
type request struct{ prompt, cached, output float64 }

// engine is the pooled fitted costs of a model's pods.
type engine struct {
	prefill  [3]float64 // seconds: base, per token, per token²
	handover [2]float64 // seconds: base, per token
	step     [3]float64 // seconds: base, per resident request, per resident KV token
	kvCap    float64    // KV tokens a pod holds (0: unknown)
	// prefillScale multiplies the fitted prefill (calibrate)
	prefillScale float64
	// observations behind the prefill and step fits (the most of any pod)
	prefillObs, stepObs int
}

// kvFill is the share of a pod's KV a steady load may fill (the rest absorbs its swings).
const kvFill = 0.9

// engine pools the coefficients of the model's pods: each fit is the mean over the pods
// that have observations for it, weighted by them (the models' defaults when none has).
func (a *Advisor) engine(eps []*pool.Endpoint) engine {
	e := engine{prefillScale: 1}
	models := a.o.Models
	if models == nil {
		models = latency.New(latency.Options{})
	}
	def := models.Coefficients("")
	var wp, ws, wh float64
	var p, s [3]float64
	var h [2]float64
	for _, ep := range eps {
		if a.o.Samples != nil {
			if smp := a.o.Samples(ep.Key()); smp != nil && smp.NumGPUBlocks > 0 && smp.BlockSize > 0 {
				e.kvCap = max(e.kvCap, float64(smp.NumGPUBlocks*smp.BlockSize))
			}
		}
		c := models.Coefficients(ep.Key())
		if n := float64(c.PrefillObservations); n > 0 {
			p[0] += n * c.PrefillBase
			p[1] += n * c.PrefillPerToken
			p[2] += n * c.PrefillQuadratic
			wp += n
			e.prefillObs = max(e.prefillObs, c.PrefillObservations)
		}
		if n := float64(c.StepObservations); n > 0 {
			s[0] += n * c.StepBase
			s[1] += n * c.StepPerRequest
			s[2] += n * c.StepPerKVToken
			ws += n
			e.stepObs = max(e.stepObs, c.StepObservations)
			if ep.Role == pool.RoleDecode {
				h[0] += n * c.HandoverBase
				h[1] += n * c.HandoverPerToken
				wh += n
			}
		}
	}
	e.prefill = [3]float64{def.PrefillBase, def.PrefillPerToken, def.PrefillQuadratic}
	if wp > 0 {
		e.prefill = [3]float64{p[0] / wp, p[1] / wp, p[2] / wp}
	}
	e.step = [3]float64{def.StepBase, def.StepPerRequest, def.StepPerKVToken}
	if ws > 0 {
		e.step = [3]float64{s[0] / ws, s[1] / ws, s[2] / ws}
	}
	e.handover = [2]float64{def.HandoverBase, def.HandoverPerToken}
	if wh > 0 {
		e.handover = [2]float64{h[0] / wh, h[1] / wh}
	}
	for i := range e.prefill {
		e.prefill[i] = max(e.prefill[i], 0)
		e.step[i] = max(e.step[i], 0)
	}
	e.step[0] = max(e.step[0], minStep)
	e.handover[0], e.handover[1] = max(e.handover[0], 0), max(e.handover[1], 0)
	return e
}

// minStep is the shortest decode step the advisor prices (a fit's base below it is noise).
const minStep = 1e-3

// fitted is the number of observations at which a fit counts as learned.
const fitted = 20

// confidence is how far the fits rest on observations: 1 when both the prefill and the
// step fits have learned (at least learned observations each), half for each that has not.
func (e *engine) confidence(learned int) float64 {
	c := 1.0
	if e.prefillObs < learned {
		c /= 2
	}
	if e.stepObs < learned {
		c /= 2
	}
	return c
}

// prefillSeconds is the fitted prefill time of a prompt, its cached tokens not computed
// (the latency models' form).
func (e *engine) prefillSeconds(q request) float64 {
	return e.prefillScale * max(e.prefill[0]+e.prefill[1]*(q.prompt-q.cached)+e.prefill[2]*(q.prompt*q.prompt-q.cached*q.cached), 1e-4)
}

// minCalibration is the PD requests the prefill calibration needs.
const minCalibration = 20

// calibrate scales the fitted prefill by what the prefill pods' time says: the seconds they
// had a prompt in over the fitted seconds of those prompts. A fit learned from prompts that
// shared the engine's iterations (several prefilled at once) counts each prompt's time as its
// own, and overstates what one costs; time covered is what the pods could not give others.
func (e *engine) calibrate(t traffic) {
	if len(t.legged) < minCalibration || t.prefillBusy <= 0 {
		return
	}
	fit := 0.0
	for _, q := range t.legged {
		fit += e.prefillSeconds(q)
	}
	if fit > 0 {
		e.prefillScale = min(max(t.prefillBusy/fit, 0.1), 10)
	}
}

// mix is a set of requests priced on the engine.
type mix struct {
	e  *engine
	ob objectives
	n  int
	// per request: the highest prefill load (share of a pod's time) at which it meets its
	// TTFT objective on a prefill pod (its hand-over after the prefill) and on a pod running
	// it whole (a decode step after it)
	loadPD, loadWhole []float64
	// means: prefill seconds, output tokens, output × KV context (a resident request's KV
	// weighted by how long it stays)
	meanS, meanO, meanOctx float64
	// decoding is the share of requests with more than one output token (TPOT applies)
	decoding float64
	// prefillRate and localRate: the highest arrival rate at which a prefill pod, and a pod
	// running the mix whole, meet the TTFT objective for the goodput share (computed once)
	prefillRate, localRate float64
}

func (e *engine) mix(xs []request, ob objectives) *mix {
	m := &mix{e: e, ob: ob, n: len(xs), loadPD: make([]float64, len(xs)), loadWhole: make([]float64, len(xs))}
	if len(xs) == 0 {
		return m
	}
	n := float64(len(xs))
	for i, q := range xs {
		s := e.prefillSeconds(q)
		obj := max(ob.ttft, ob.ttftPrefill*s)
		m.loadPD[i] = loadWithin(s, obj-(e.handover[0]+e.handover[1]*q.prompt+e.step[0]))
		m.loadWhole[i] = loadWithin(s, obj-e.step[0])
		m.meanS += s / n
		m.meanO += q.output / n
		m.meanOctx += q.output * (q.prompt + q.output/2) / n
		if q.output > 1 {
			m.decoding += 1 / n
		}
	}
	m.prefillRate = quantileLoad(m.loadPD, ob.goodput) / m.meanS
	m.localRate = quantileLoad(m.loadWhole, ob.goodput) / m.meanS
	return m
}

// loadWithin is the highest prefill load at which a prompt of s seconds is done within room
// seconds (s / (1 − load) ≤ room), −1 when it never is.
func loadWithin(s, room float64) float64 {
	if room <= s {
		return -1
	}
	return 1 - s/room
}

// quantileLoad is the highest prefill load at which the goodput share of the requests, each
// meeting its objective up to its own load, still do (0 when none can). A pod that prefills
// shares its iterations among the prompts it holds (chunked prefill), so a prompt of s
// seconds takes s / (1 − load) there, whatever the others' sizes (processor sharing).
func quantileLoad(loads []float64, goodput float64) float64 {
	if len(loads) == 0 {
		return 0
	}
	sorted := slices.Clone(loads)
	slices.Sort(sorted)
	slices.Reverse(sorted)
	i := min(len(sorted)-1, max(0, int(math.Ceil(goodput*float64(len(sorted))))-1))
	return max(sorted[i], 0)
}

// highest is the highest rate in [0, hi] at which ok holds, by bisection (ok must hold
// below any rate it holds at).
func highest(hi float64, ok func(r float64) bool) float64 {
	if hi <= 0 || math.IsNaN(hi) {
		return 0
	}
	if math.IsInf(hi, 1) {
		hi = 1
		for i := 0; i < 60 && ok(hi); i++ {
			hi *= 2
		}
	}
	if ok(hi) {
		return hi
	}
	lo := 0.0
	for range 40 {
		mid := (lo + hi) / 2
		if ok(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// decoding is what one pod that decodes carries per second: requests decoding there
// (their decodes only: PD) of one mix and requests run whole there of another.
type decoding struct {
	pd    *mix
	rPD   float64
	whole *mix
	rW    float64
}

// ok says whether the pod meets the objectives under d: its prompts' TTFT, its TPOT, its KV.
func (d decoding) ok() bool {
	e, ob := d.anyMix()
	if e == nil {
		return true
	}
	var rho, w, y, kv float64 // prefill share, prompts/s, output tokens/s, output·context/s
	tpotBinds := false
	for _, part := range []struct {
		m     *mix
		r     float64
		whole bool
	}{{d.pd, d.rPD, false}, {d.whole, d.rW, true}} {
		if part.m == nil || part.r <= 0 {
			continue
		}
		y += part.r * part.m.meanO
		kv += part.r * part.m.meanOctx
		tpotBinds = tpotBinds || part.m.decoding > 1-ob.goodput
		if part.whole {
			if part.r > part.m.localRate {
				return false
			}
			rho += part.r * part.m.meanS
			w += part.r
		}
	}
	if rho >= 1 {
		return false
	}
	// TPOT as the latency models predict it: the decode step at the requests and KV resident
	// (N = y·τ, KV = kv·τ by Little's law) stretched by the share of the pod's time its
	// prefills take, τ = step(N, KV) / (1 − ρ), solved for τ.
	room := 1 - rho - e.step[1]*y - e.step[2]*kv
	if room <= 0 {
		return false
	}
	tau := e.step[0] / room
	if tpotBinds && tau > ob.tpot {
		return false
	}
	if K := e.kvCap * kvFill; K > 0 && kv*tau > K {
		return false
	}
	return true
}

func (d decoding) anyMix() (*engine, objectives) {
	for _, m := range []*mix{d.pd, d.whole} {
		if m != nil && m.n > 0 {
			return m.e, m.ob
		}
	}
	return nil, objectives{}
}

// cut is one way of dividing the mix: the prompts from a length up to the pairs (pd), the
// rest run whole (short), and the share of requests on the pairs.
type cut struct {
	pd, short *mix
	share     float64
	// standard is a standard pod's capacity for the short prompts
	standard float64
}

// cuts are the prompt-length quantiles tried as the line between the pairs' requests and
// those run whole, 0 (every request on the pairs) to 1 (none).
var cuts = func() []float64 {
	out := make([]float64, 0, 51)
	for i := 0; i <= 50; i++ {
		out = append(out, float64(i)/50)
	}
	return out
}()

// cuts prices the ways of dividing xs that send to the pairs at least every prompt longer
// than longestWhole (the router has not been seen running such a prompt whole: evidence of
// what it would do, which the advisor does not second-guess).
func (e *engine) cuts(xs []request, longestWhole float64, ob objectives) []cut {
	sorted := slices.Clone(xs)
	slices.SortStableFunc(sorted, func(a, b request) int { return cmp.Compare(a.prompt, b.prompt) })
	out := make([]cut, 0, len(cuts))
	for _, q := range cuts {
		i := int(math.Round(q * float64(len(sorted))))
		if i > 0 && sorted[i-1].prompt > longestWhole {
			break
		}
		c := cut{short: e.mix(sorted[:i], ob), pd: e.mix(sorted[i:], ob), share: float64(len(sorted)-i) / float64(len(sorted))}
		if c.short.n > 0 {
			c.standard = highest(c.short.localRate, func(r float64) bool { return decoding{whole: c.short, rW: r}.ok() })
		}
		out = append(out, c)
	}
	return out
}

// serves says whether the split serves rate req/s of the mix divided as c says: the pairs'
// prompts on the prefill pods and their decodes on the decode pods; the rest on the standard
// pods up to their capacity, then run whole on the decode pods.
func (c *cut) serves(s Split, rate float64) bool {
	pdRate, wRate := rate*c.share, rate*(1-c.share)
	if pdRate > 0 && (s.Prefill == 0 || s.Decode == 0 || pdRate > float64(s.Prefill)*c.pd.prefillRate) {
		return false
	}
	wRate -= min(wRate, float64(s.Standard)*c.standard)
	if s.Decode == 0 {
		return wRate <= 0
	}
	d := float64(s.Decode)
	return decoding{pd: c.pd, rPD: pdRate / d, whole: c.short, rW: wRate / d}.ok()
}

// capacity is the highest rate of the mix the split serves under c.
func (c *cut) capacity(s Split) float64 {
	hi := math.Inf(1)
	if c.share > 0 {
		hi = min(hi, float64(s.Prefill)*c.pd.prefillRate/c.share)
	}
	if c.share < 1 {
		hi = min(hi, (float64(s.Standard)*c.standard+float64(s.Decode)*c.short.localRate)/(1-c.share))
	}
	return highest(hi, func(r float64) bool { return c.serves(s, r) })
}

// capacityOf is the split's capacity at the best cut.
func capacityOf(cs []cut, s Split) float64 {
	best := 0.0
	for i := range cs {
		best = max(best, cs[i].capacity(s))
	}
	return best
}
