package sim

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The engine scenarios keep the calibrated profile's mean cost. A stochastic scenario's
// realised ratio Σ f·c / Σ c over iterations of calibrated cost c and independent factors f
// of mean 1 has standard deviation sd(f)·√(Σc²)/Σc; the tests allow four of them (the draws
// are seeded, so a test passes or fails the same way every run).

// decodeWork is a decode iteration of batch sequences at ctx tokens of context.
func decodeWork(batch, ctx int) []Work {
	w := make([]Work, batch)
	for i := range w {
		w[i] = Work{Done: ctx, N: 1}
	}
	return w
}

// costAll runs n decode iterations of varied size through x and returns Σc, Σc².
func costAll(t *testing.T, x *Perturbation, n int, seed uint64) (sum, sq float64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	p := Llama8BH100()
	for range n {
		w := decodeWork(1+r.IntN(64), r.IntN(16000))
		c := IterationSeconds(p, w)
		x.Cost(w, nil)
		sum += c
		sq += c * c
	}
	return sum, sq
}

func lognormalSD(sigma float64) float64 { return math.Sqrt(math.Exp(sigma*sigma) - 1) }

func stallSD() float64 {
	x := (1 - StallProb*StallFactor) / (1 - StallProb)
	m2 := StallProb*StallFactor*StallFactor + (1-StallProb)*x*x
	return math.Sqrt(m2 - 1)
}

func TestScenarioKeepsMeanCost(t *testing.T) {
	p := Llama8BH100()
	for _, tc := range []struct {
		name string
		sd   float64 // of an iteration's factor
	}{
		{ScenarioJitter, lognormalSD(JitterSigma)},
		{ScenarioStalls, stallSD()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 3; seed++ {
				x, err := NewPerturbation(tc.name, seed, p, PodRole{Role: "decode", Count: 4}, nil)
				if err != nil {
					t.Fatal(err)
				}
				sum, sq := costAll(t, x, 50_000, seed)
				tol := 4 * tc.sd * math.Sqrt(sq) / sum
				if got := x.Ratio(); math.Abs(got-1) > tol {
					t.Errorf("seed %d: realised cost ratio %.4f, want 1 ± %.4f", seed, got, tol)
				}
				t.Logf("seed %d: realised ratio %.4f (tolerance ±%.4f), %d stalls", seed, x.Ratio(), tol, x.Stalls)
				if tc.name == ScenarioStalls && (x.Stalls < 700 || x.Stalls > 1300) {
					t.Errorf("seed %d: %d stalls in 200000 iterations, want about %d", seed, x.Stalls, int(StallProb*50_000))
				}
			}
		})
	}
}

func TestSlowPodKeepsRoleMean(t *testing.T) {
	p := Llama8BH100()
	for _, role := range []string{"prefill", "decode"} {
		for _, count := range []int{2, 4, 8} {
			var total float64
			slow := 0
			for i := range count {
				x, err := NewPerturbation(ScenarioSlowPod, 7, p, PodRole{Role: role, Index: i, Count: count}, nil)
				if err != nil {
					t.Fatal(err)
				}
				x.Cost(decodeWork(8, 1000), nil)
				total += x.Ratio()
				if x.Ratio() == SlowFactor {
					slow++
				}
			}
			if math.Abs(total/float64(count)-1) > 1e-12 || slow != 1 {
				t.Errorf("%s × %d: mean pod ratio %.6f with %d slow pods, want 1 with one", role, count, total/float64(count), slow)
			}
		}
	}
	// standard pods are untouched
	x, _ := NewPerturbation(ScenarioSlowPod, 7, p, PodRole{Role: "standard", Count: 2}, nil)
	x.Cost(decodeWork(8, 1000), nil)
	if x.Ratio() != 1 {
		t.Errorf("standard pod ratio %v, want 1", x.Ratio())
	}
}

// prefillAlone is a prompt's idle prefill under x, chunked as PrefillSeconds chunks it.
func prefillAlone(x *Perturbation, p Params, n int, s *Seq) float64 {
	total := 0.0
	for done := 0; done < n; {
		k := min(n-done, p.MaxBatchedTokens)
		total += x.Cost([]Work{{Done: done, N: k, First: done == 0}}, []*Seq{s})
		done += k
	}
	return total
}

func TestShapeKeepsMeanPrefillAndIsNotQuadratic(t *testing.T) {
	p := Llama8BH100()
	r := rand.New(rand.NewPCG(3, 3))
	prompts := make([]int, 2000)
	for i := range prompts {
		prompts[i] = 16 + r.IntN(40000)
	}
	x, err := NewPerturbation(ScenarioShape, 1, p, PodRole{Role: "prefill", Count: 4}, prompts)
	if err != nil {
		t.Fatal(err)
	}
	var model, shaped float64
	for _, n := range prompts {
		model += PrefillSeconds(p, n)
		shaped += prefillAlone(x, p, n, &Seq{Prompt: n})
	}
	// compute-bound chunks: the normalisation is exact up to the memory floor of tiny prompts
	if math.Abs(shaped/model-1) > 0.01 {
		t.Errorf("shaped/model idle prefill over the calibration prompts = %.4f, want 1 ± 0.01", shaped/model)
	}
	// and the shape is one a linear-plus-quadratic cost cannot follow: a 1000-token prompt is
	// cheaper per token than the model says and a 10000-token one dearer.
	a := prefillAlone(x, p, 1000, &Seq{Prompt: 1000}) / PrefillSeconds(p, 1000)
	b := prefillAlone(x, p, 10000, &Seq{Prompt: 10000}) / PrefillSeconds(p, 10000)
	if !(a < 1 && b > 1) {
		t.Errorf("shape factors at 1000 and 10000 tokens: %.3f, %.3f; want below and above 1", a, b)
	}
}

func TestHiddenCacheKeepsMeanPrefill(t *testing.T) {
	p := Llama8BH100()
	r := rand.New(rand.NewPCG(5, 5))
	x, err := NewPerturbation(ScenarioHiddenCache, 2, p, PodRole{Role: "prefill", Count: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sum, sq float64
	hits := 0
	const n = 20_000
	for range n {
		k := 2048 + r.IntN(6144) // one compute-bound chunk even when hit
		s := &Seq{Prompt: k, Hashes: []uint64{r.Uint64()}}
		c := PrefillSeconds(p, k)
		if x.Cost([]Work{{N: k, First: true}}, []*Seq{s}) < c {
			hits++
		}
		sum += c
		sq += c * c
	}
	a, b := 1-HiddenHitShare, HiddenFactor(0.99)
	sd := math.Sqrt(HiddenHitProb*(1-HiddenHitProb)) * (b - a)
	tol := 4 * sd * math.Sqrt(sq) / sum
	if got := x.Ratio(); math.Abs(got-1) > tol {
		t.Errorf("realised cost ratio %.4f, want 1 ± %.4f", got, tol)
	}
	hsd := math.Sqrt(HiddenHitProb * (1 - HiddenHitProb) / n)
	if f := float64(hits) / n; math.Abs(f-HiddenHitProb) > 4*hsd {
		t.Errorf("hit share %.3f, want %.3f ± %.3f", f, HiddenHitProb, 4*hsd)
	}
}

// Under all, decode iterations see slow-pod × jitter × stalls: over the pods of a role the
// mean is still the profile's.
func TestAllKeepsMeanCost(t *testing.T) {
	p := Llama8BH100()
	const count = 4
	var ratios float64
	var tol float64
	j, s := lognormalSD(JitterSigma), stallSD()
	sd := math.Sqrt((1+j*j)*(1+s*s) - 1)
	for i := range count {
		x, err := NewPerturbation(ScenarioAll, 11, p, PodRole{Role: "decode", Index: i, Count: count}, []int{1000})
		if err != nil {
			t.Fatal(err)
		}
		sum, sq := costAll(t, x, 100_000, uint64(i))
		ratios += x.Ratio() / float64(count)
		tol += 4 * sd * SlowFactor * math.Sqrt(sq) / sum / count
	}
	if math.Abs(ratios-1) > tol {
		t.Errorf("mean pod ratio under all %.4f, want 1 ± %.4f", ratios, tol)
	}
}

func TestScenarioNames(t *testing.T) {
	if _, err := NewPerturbation("bogus", 1, Llama8BH100(), PodRole{}, nil); err == nil {
		t.Error("unknown scenario accepted")
	}
	if x, err := NewPerturbation(ScenarioNone, 1, Llama8BH100(), PodRole{}, nil); x != nil || err != nil {
		t.Errorf("none: %v, %v; want nil, nil", x, err)
	}
}

func TestBatchUsesCost(t *testing.T) {
	p := Llama8BH100()
	b := NewBatch(p)
	b.Cost = func(work []Work, seqs []*Seq) float64 {
		if len(work) != len(seqs) {
			t.Errorf("%d work items for %d sequences", len(work), len(seqs))
		}
		return 0.123
	}
	b.Add(&Seq{Kind: SeqWhole, Prompt: 100, Out: 2})
	if _, secs, ok := b.Plan(); !ok || secs != 0.123 {
		t.Errorf("Plan = %v, %v; want the Cost hook's 0.123", secs, ok)
	}
}
