package latency

import "math"

// The hand-over by pair distance: a decode pod pulls KV from prefill pods on its node, in its
// NVLink domain, in its zone or beyond, and each of those links has its own cost. Besides the
// pod's hand-over model over every pull, each distance class (the index of the first
// topology label a pair shares, package config's TANDEM_TOPOLOGY_LABELS) learns its own,
// started from the pod's model when its first pull of that class is seen; a class with at
// least MinClassObservations pulls predicts the pulls of its class.

// DistanceClasses is the number of pair distance classes the models learn apart (up to four
// topology labels, and "none shared").
const DistanceClasses = 5

// MinClassObservations is the pulls of a distance class after which its own hand-over model
// predicts that class.
const MinClassObservations = 3

// classes is a decode pod's hand-over models by distance class, allocated at the first pull
// whose class is known.
type classes [DistanceClasses]rls

// fitHandoverAt folds an observed hand-over of a pull from a pod at distance class c into
// that class's model (a class out of range is ignored).
func (q *pod) fitHandoverAt(c, tokens int, observed float64) {
	if c < 0 || c >= DistanceClasses || !(observed > 0) {
		return
	}
	if q.byDistance == nil {
		q.byDistance = new(classes)
	}
	r := &q.byDistance[c]
	if r.n == 0 {
		// Started from the pod's hand-over over every pull, with room to move fast: a class
		// differs from the average by what its link costs.
		*r = newRLS([]float64{q.handover.theta[0], q.handover.theta[1]}, []float64{4e-3, 1})
	}
	x := handoverX(tokens)
	pred := math.Max(math.Max(r.theta[0], 0)*x[0]+math.Max(r.theta[1], 0)*x[1], minStep)
	fitRelative(r, x, pred, observed)
}

// readClasses copies the learned classes' coefficients into f.
func (f *Forecast) readClasses(q *pod) {
	f.learned = 0
	if q.byDistance == nil {
		return
	}
	for c := range q.byDistance {
		r := &q.byDistance[c]
		if r.obs < MinClassObservations {
			continue
		}
		f.learned |= 1 << c
		f.byDistance[c] = [2]float64{max(r.theta[0], 0), max(r.theta[1], 0)}
	}
}

// transfer is the predicted KV transfer of tokens over every pull.
func (f *Forecast) transfer(tokens int) float64 {
	return max(f.handover[0]+f.handover[1]*float64(tokens)/tokScale, minStep)
}

// Learned reports whether distance class c has its own hand-over model yet.
func (f *Forecast) Learned(c int) bool {
	return c >= 0 && c < DistanceClasses && f.learned&(1<<c) != 0
}

// TransferShift is how much longer (negative: shorter) the KV transfer of tokens from a pod
// at distance class c is predicted to take than over every pull: 0 until the class has
// MinClassObservations pulls (or c is out of range).
func (f *Forecast) TransferShift(tokens, c int) float64 {
	if !f.Learned(c) {
		return 0
	}
	k := f.byDistance[c]
	return max(k[0]+k[1]*float64(tokens)/tokScale, minStep) - f.transfer(tokens)
}

// TPOTAndHandoverAt is TPOTAndHandover for a pull from a pod at distance class c (-1:
// unknown), the class's own transfer once it is learned.
func (f *Forecast) TPOTAndHandoverAt(tokens int, after float64, c int) (tpot, handover float64) {
	tpot, handover = f.TPOTAndHandover(tokens, after)
	return tpot, handover + f.TransferShift(tokens, c)
}
