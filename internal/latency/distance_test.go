package latency

import (
	"math/rand/v2"
	"testing"

	"github.com/tandem-epp/tandem/internal/outcome"
)

// A decode pod pulls from a prefill pod on its node (class 0, 4 µs per token) and from one
// in another zone (class 3, 40 µs per token). Each class shifts the pod's hand-over only once
// it saw 3 pulls; then the far class is predicted dearer than the pod's average and the near
// one cheaper, by about the difference of their links; a pull of unknown class (Distance 0)
// teaches no class.
func TestHandoverByDistanceClass(t *testing.T) {
	r := newRig(Options{})
	pNear, pFar, d := "ns/p-near:1", "ns/p-far:1", "ns/d:1"
	perToken := map[int]float64{0: 4e-6, 3: 40e-6}
	rng := rand.New(rand.NewPCG(26, 1))
	pull := func(from string, class int, tokens int) {
		tr := r.rec.Start(outcome.KindPD, from, d, tokens)
		r.m.Charge(tr.ID(), Charge{Kind: outcome.KindPD, Prefill: from, Destination: d, Prompt: Prompt{Tokens: tokens}, Service: 0.1, Distance: class + 1})
		r.clock.Advance(secs(0.1))
		ahead, _ := r.m.Local(d, r.clock.Now())
		it := r.m.TPOT(d, tokens, 0)
		tr.PrefillEnd(nil, true)
		r.clock.Advance(secs(0.002 + perToken[class]*float64(tokens) + ahead + it))
		tr.Chunk(5)
		r.clock.Advance(secs(0.05))
		tr.End(nil)
		r.clock.Advance(secs(1))
	}
	for i := range 2 {
		pull(pFar, 3, 10000)
		if f := r.m.Forecast(d); f.Learned(3) || f.TransferShift(10000, 3) != 0 {
			t.Fatalf("after %d far pulls: class learned %v, shift %.4f s: want none before %d pulls", i+1, f.Learned(3), f.TransferShift(10000, 3), MinClassObservations)
		}
	}
	pull(pFar, 3, 10000)
	if f := r.m.Forecast(d); !f.Learned(3) || !(f.TransferShift(10000, 3) > 0) {
		t.Fatalf("after 3 far pulls: learned %v, shift %.4f s: want a positive shift", f.Learned(3), f.TransferShift(10000, 3))
	}
	for range 60 {
		pull(pNear, 0, 2000+rng.IntN(18000))
		pull(pFar, 3, 2000+rng.IntN(18000))
	}
	// A pull of unknown class leaves the classes as they were.
	before := r.m.HandoverByDistance(d)
	tr := r.rec.Start(outcome.KindPD, pNear, d, 5000)
	r.m.Charge(tr.ID(), Charge{Kind: outcome.KindPD, Prefill: pNear, Destination: d, Prompt: Prompt{Tokens: 5000}, Service: 0.1})
	r.clock.Advance(secs(0.1))
	tr.PrefillEnd(nil, true)
	r.clock.Advance(secs(0.1))
	tr.Chunk(5)
	tr.End(nil)
	if after := r.m.HandoverByDistance(d); after[0].Observations != before[0].Observations || after[3].Observations != before[3].Observations {
		t.Errorf("a pull of unknown class was counted: %+v → %+v", before, after)
	}

	f := r.m.Forecast(d)
	sNear, sFar := f.TransferShift(10000, 0), f.TransferShift(10000, 3)
	if !(sNear < 0 && sFar > 0) {
		t.Errorf("shifts at 10k tokens: near %.4f s, far %.4f s: want the near class below the pod's average and the far above", sNear, sFar)
	}
	t.Logf("shifts at 10k tokens: near %.4f s, far %.4f s", sNear, sFar)
	if diff, want := sFar-sNear, (40e-6-4e-6)*10000; diff < 0.7*want || diff > 1.3*want {
		t.Errorf("far − near at 10k tokens = %.4f s, want ≈ %.2f s (their links' difference)", diff, want)
	}
	_, h := f.TPOTAndHandover(10000, 10)
	if _, hFar := f.TPOTAndHandoverAt(10000, 10, 3); !near(hFar, h+sFar, 1e-9) {
		t.Errorf("hand-over from the far class %.4f s, want the average %.4f + its shift %.4f", hFar, h, sFar)
	}
	if _, hUnknown := f.TPOTAndHandoverAt(10000, 10, -1); hUnknown != h {
		t.Errorf("hand-over of an unknown class %.4f s, want the average %.4f", hUnknown, h)
	}
}
