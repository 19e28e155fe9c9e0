package latency

// The hand-over by pair distance: a decode pod pulls KV from prefill pods on its node, in its
// NVLink domain, in its zone or beyond, and each of those links has its own bandwidth. Besides
// the pod's hand-over model over every pull, each distance class (the index of the first
// topology label a pair shares, package config's TANDEM_TOPOLOGY_LABELS) learns how much
// longer per prompt token its pulls take than that model predicts: a least-squares slope
// through the origin of the residuals over the prompt's tokens, with forgetting, shrunk
// towards 0 as if one pull of classPriorTokens had shown no difference. The slope fits what
// a link's bandwidth costs, and a pull's queueing (the decode pod's iterations, its link's
// other pulls), which does not grow with its prompt, weighs little against long prompts. A
// class with at least MinClassObservations pulls shifts the predictions of its pulls.

// DistanceClasses is the number of pair distance classes the models learn apart (up to four
// topology labels, and "none shared").
const DistanceClasses = 5

// MinClassObservations is the pulls of a distance class after which it shifts the hand-over
// predicted for its pulls.
const MinClassObservations = 3

const (
	classForget      = 0.99 // an observation's weight halves after ~70 newer ones of its class
	classPriorTokens = 2000
)

// classFit is one distance class's residual slope: Σ x·r and Σ x² over its pulls (x the
// prompt in tokScale units, r the observed hand-over minus the pod's prediction), forgotten
// at classForget per pull.
type classFit struct {
	sxr, sxx float64
	n        int
}

// slope is the class's extra seconds per tokScale prompt tokens.
func (c *classFit) slope() float64 {
	const prior = (classPriorTokens / tokScale) * (classPriorTokens / tokScale)
	return c.sxr / (c.sxx + prior)
}

// classes is a decode pod's fits by distance class, allocated at the first pull whose class
// is known.
type classes [DistanceClasses]classFit

// fitHandoverAt folds an observed hand-over of a pull of tokens from a pod at distance class
// c into that class's fit (a class out of range is ignored). Call it before the pod's own
// model learns from the same pull.
func (q *pod) fitHandoverAt(c, tokens int, observed float64) {
	if c < 0 || c >= DistanceClasses || !(observed > 0) || tokens <= 0 {
		return
	}
	if q.byDistance == nil {
		q.byDistance = new(classes)
	}
	x := float64(tokens) / tokScale
	r := observed - q.handoverSeconds(tokens)
	f := &q.byDistance[c]
	f.sxr = classForget*f.sxr + x*r
	f.sxx = classForget*f.sxx + x*x
	f.n++
}

// readClasses copies the learned classes' slopes into f.
func (f *Forecast) readClasses(q *pod) {
	f.learned = 0
	if q.byDistance == nil {
		return
	}
	for c := range q.byDistance {
		if q.byDistance[c].n >= MinClassObservations {
			f.learned |= 1 << c
			f.byDistance[c] = q.byDistance[c].slope()
		}
	}
}

// classHandovers is the pod's fits by distance class, in plain units.
func (q *pod) classHandovers() (out [DistanceClasses]ClassHandover) {
	if q.byDistance == nil {
		return out
	}
	for c := range q.byDistance {
		out[c] = ClassHandover{ExtraPerToken: q.byDistance[c].slope() / tokScale, Observations: q.byDistance[c].n}
	}
	return out
}

// transfer is the predicted KV transfer of tokens over every pull.
func (f *Forecast) transfer(tokens int) float64 {
	return max(f.handover[0]+f.handover[1]*float64(tokens)/tokScale, minStep)
}

// Learned reports whether distance class c shifts its pulls' hand-over yet.
func (f *Forecast) Learned(c int) bool {
	return c >= 0 && c < DistanceClasses && f.learned&(1<<c) != 0
}

// TransferShift is how much longer (negative: shorter) the KV transfer of tokens from a pod
// at distance class c is predicted to take than over every pull: 0 until the class has
// MinClassObservations pulls (or c is out of range); the transfer never falls below the
// shortest one predicted.
func (f *Forecast) TransferShift(tokens, c int) float64 {
	if !f.Learned(c) {
		return 0
	}
	t := f.transfer(tokens)
	return max(t+f.byDistance[c]*float64(tokens)/tokScale, minStep) - t
}

// TPOTAndHandoverAt is TPOTAndHandover for a pull from a pod at distance class c (-1:
// unknown), shifted by the class once it is learned.
func (f *Forecast) TPOTAndHandoverAt(tokens int, after float64, c int) (tpot, handover float64) {
	tpot, handover = f.TPOTAndHandover(tokens, after)
	return tpot, handover + f.TransferShift(tokens, c)
}
