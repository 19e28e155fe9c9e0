package latency

import "testing"

// A prefill model's prediction keeps each coefficient non-negative and is never below
// minService: θ = (0.01, −0.5, 0.2) at a 10k-token prompt (1, 1, 1) is 0.01 + 0 + 0.2.
func TestServiceOf(t *testing.T) {
	r := newRLS([]float64{0.01, -0.5, 0.2}, []float64{1, 1, 1})
	for _, c := range []struct {
		name string
		p    Prompt
		want float64
	}{
		{"10k tokens: the negative per-token term is dropped", Prompt{Tokens: 10000}, 0.21},
		{"all cached: the base alone (0.01)", Prompt{Tokens: 10000, Cached: 10000}, 0.01},
		{"more cached than the prompt counts as all", Prompt{Tokens: 10000, Cached: 20000}, 0.01},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := serviceOf(&r, prefillX(c.p)); !near(got, c.want, 1e-12) {
				t.Errorf("service %.4f, want %.4f", got, c.want)
			}
		})
	}
	zero := newRLS([]float64{0, 0, 0}, []float64{1, 1, 1})
	if got := serviceOf(&zero, prefillX(Prompt{Tokens: 100})); got != minService {
		t.Errorf("a zero model predicts %v, want the floor %v", got, minService)
	}
}

// fitRelative ignores an observation that is not positive, and once the model has seen
// clipAfter observations clips an outlier to [ŷ/4, 4ŷ]: a 100 s observation against a 1 s
// prediction then moves the model exactly as a 4 s one does.
func TestFitRelativeClipsOutliers(t *testing.T) {
	x := [3]float64{1}
	fit := func(obs int, y float64) float64 {
		r := newRLS([]float64{1}, []float64{1})
		r.obs = obs
		fitRelative(&r, x, 1, y)
		return r.theta[0]
	}
	if got := fit(0, 0); got != 1 {
		t.Errorf("a zero observation moved the model to %v", got)
	}
	if a, b := fit(clipAfter, 100), fit(clipAfter, 4); a != b {
		t.Errorf("after %d observations: 100 s moved θ to %v, 4 s to %v; want the same", clipAfter, a, b)
	}
	if a, b := fit(clipAfter-1, 100), fit(clipAfter-1, 4); !(a > b) {
		t.Errorf("before %d observations: 100 s moved θ to %v, not beyond 4 s's %v", clipAfter, a, b)
	}
	if a, b := fit(clipAfter, 0.01), fit(clipAfter, 0.25); a != b {
		t.Errorf("a 0.01 s observation against 1 s: θ %v, want the 0.25 s one's %v", a, b)
	}
}
