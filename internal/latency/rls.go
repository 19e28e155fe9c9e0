package latency

import "math"

// rls is recursive least squares with exponential forgetting over at most three features:
// θ minimises Σ λ^(age) · w · (y − θ·x)². It starts from a prior θ0 with covariance P0
// (how far the first observations may move it) and forgets at λ per observation, so a pod
// whose speed changes (a new model version, a throttled GPU) is re-learned.
type rls struct {
	n     int // features in use (≤ 3)
	theta [3]float64
	p     [3][3]float64
	obs   int // observations so far
}

const (
	// forget is λ: an observation's weight halves after ~230 newer ones.
	forget = 0.997
	// maxTrace bounds the covariance when a feature is never excited (forgetting would
	// otherwise let P grow without bound: "covariance wind-up").
	maxTrace = 1e6
)

func newRLS(theta0 []float64, p0 []float64) rls {
	r := rls{n: len(theta0)}
	for i := range theta0 {
		r.theta[i] = theta0[i]
		r.p[i][i] = p0[i]
	}
	return r
}

// predict is θ·x.
func (r *rls) predict(x [3]float64) float64 {
	y := 0.0
	for i := 0; i < r.n; i++ {
		y += r.theta[i] * x[i]
	}
	return y
}

// update folds in one observation y at x with weight w (> 0).
func (r *rls) update(x [3]float64, y, w float64) {
	if !(w > 0) || math.IsNaN(y) || math.IsInf(y, 0) {
		return
	}
	n := r.n
	var px [3]float64
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			px[i] += r.p[i][j] * x[j]
		}
	}
	den := forget / w
	for i := 0; i < n; i++ {
		den += x[i] * px[i]
	}
	if !(den > 0) {
		return
	}
	e := y - r.predict(x)
	trace := 0.0
	for i := 0; i < n; i++ {
		k := px[i] / den
		r.theta[i] += k * e
		for j := 0; j < n; j++ {
			r.p[i][j] = (r.p[i][j] - k*px[j]) / forget
		}
		trace += r.p[i][i]
	}
	if trace > maxTrace {
		s := maxTrace / trace
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				r.p[i][j] *= s
			}
		}
	}
	r.obs++
}
