package sim

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
)

// Engine scenarios: seeded ways a pod's engine departs from its calibrated profile while
// keeping its mean cost, so a router is tested on engines that misbehave rather than on the
// deterministic model its latency fits have exactly the form of. A scenario perturbs the
// length of each iteration a Batch plans (Batch.Cost); nothing a router reads names it.
//
//   - jitter: every iteration's length times a lognormal factor of mean 1 (σ = JitterSigma);
//   - stalls: a StallProb share of iterations last StallFactor times their length (what a
//     preemption storm, a recompute or a slow KV transfer does to a step), every other one
//     slightly shorter, so the mean is unchanged;
//   - slow-pod: one prefill and one decode pod SlowFactor times slower, the others of their
//     role faster, so the role's mean pod is the profile;
//   - shape: prefill compute times a step function of the context length (ShapeSteps), which
//     no linear-plus-quadratic prompt-cost fit can follow, normalised so a workload's mean idle
//     prefill is unchanged;
//   - hidden-cache: a HiddenHitProb share of (pod, prompt) pairs find HiddenHitShare of their
//     prompt cached where the router cannot see it (their prefill compute times
//     1 − HiddenHitShare), every other prompt's prefill dearer, so the mean is unchanged;
//   - all: every one of them at once (independent factors, each of mean 1).

// Scenario names, in the order reports list them.
const (
	ScenarioNone        = "none"
	ScenarioJitter      = "jitter"
	ScenarioStalls      = "stalls"
	ScenarioSlowPod     = "slow-pod"
	ScenarioShape       = "shape"
	ScenarioHiddenCache = "hidden-cache"
	ScenarioAll         = "all"
)

// ScenarioNames lists every scenario.
var ScenarioNames = []string{ScenarioNone, ScenarioJitter, ScenarioStalls, ScenarioSlowPod, ScenarioShape, ScenarioHiddenCache, ScenarioAll}

// The scenarios' constants.
const (
	JitterSigma    = 0.25  // lognormal σ of an iteration's length factor
	StallProb      = 0.005 // share of iterations that stall
	StallFactor    = 20.0  // a stalled iteration's length over its calibrated length
	SlowFactor     = 1.6   // the slow pod of a role over the profile
	HiddenHitProb  = 0.3   // share of (pod, prompt) pairs with a hidden prefix hit
	HiddenHitShare = 0.7   // share of the prompt's compute such a hit saves
)

// ShapeSteps are the prefill-compute factors of the shape scenario by context length (before
// normalisation): a chunk ending at a context below Upto tokens costs Factor times the model's.
var ShapeSteps = []struct {
	Upto   int
	Factor float64
}{{1024, 0.6}, {4096, 1.0}, {16384, 1.7}, {math.MaxInt, 1.2}}

// CheckScenario returns an error naming the valid scenarios if name is not one of them.
func CheckScenario(name string) error {
	if !slices.Contains(ScenarioNames, name) {
		return fmt.Errorf("unknown engine scenario %q; valid: %s", name, strings.Join(ScenarioNames, ", "))
	}
	return nil
}

func (s scenarioSet) has(name string) bool { return s.name == name || s.name == ScenarioAll }

type scenarioSet struct{ name string }

// PodRole is what a scenario needs to know of a pod: its role ("prefill", "decode" or
// "standard"), its index among the pods of that role, and how many there are.
type PodRole struct {
	Role         string
	Index, Count int
}

// Perturbation is one pod's engine under a scenario: its Cost replaces IterationSeconds in
// the pod's Batch. It records what it did, for the report.
type Perturbation struct {
	p      Params
	set    scenarioSet
	rng    *rand.Rand
	seed   uint64
	podID  uint64
	slow   float64 // the pod's fixed factor (slow-pod)
	norm   float64 // shape normalisation
	stallX float64 // length factor of a non-stalled iteration (stalls)

	// BaseSeconds and Seconds are the calibrated and the perturbed lengths of every
	// iteration costed so far; Seconds/BaseSeconds is the realised cost ratio.
	BaseSeconds, Seconds float64
	// Stalled says whether the last iteration costed was a stall; Stalls counts them.
	Stalled bool
	Stalls  int
}

// NewPerturbation returns pod's engine under the named scenario with the given seed.
// calibration is the prompt lengths of the workload (the shape scenario keeps their mean
// idle prefill time). The none scenario returns nil: the calibrated profile unchanged.
func NewPerturbation(name string, seed uint64, p Params, pod PodRole, calibration []int) (*Perturbation, error) {
	if err := CheckScenario(name); err != nil {
		return nil, err
	}
	if name == ScenarioNone {
		return nil, nil
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", pod.Role, pod.Index)
	x := &Perturbation{p: p, set: scenarioSet{name}, seed: seed, podID: h.Sum64(), slow: 1, norm: 1, stallX: 1}
	x.rng = rand.New(rand.NewPCG(seed, x.podID))
	if x.set.has(ScenarioStalls) {
		x.stallX = (1 - StallProb*StallFactor) / (1 - StallProb)
	}
	if x.set.has(ScenarioSlowPod) && pod.Count > 1 && (pod.Role == "prefill" || pod.Role == "decode") {
		slowIdx := int(seed % uint64(pod.Count))
		if pod.Index == slowIdx {
			x.slow = SlowFactor
		} else {
			x.slow = (float64(pod.Count) - SlowFactor) / float64(pod.Count-1)
		}
	}
	if x.set.has(ScenarioShape) {
		x.norm = ShapeNorm(p, calibration)
	}
	return x, nil
}

// shapeFactor is the shape scenario's step factor for a chunk ending at context e.
func shapeFactor(e int) float64 {
	for _, s := range ShapeSteps {
		if e < s.Upto {
			return s.Factor
		}
	}
	return 1
}

// shapedCompute is a prefill chunk's compute under the shape steps (before normalisation).
func shapedCompute(p Params, w Work) float64 {
	d, e := float64(w.Done), float64(w.Done+w.N)
	return shapeFactor(w.Done+w.N) * (p.PrefillPerToken*float64(w.N) + p.PrefillQuadratic*(e*e-d*d))
}

// ShapeNorm is the factor that makes the shaped idle prefill of the given prompts (chunked as
// PrefillSeconds chunks them) take as long in total as the model's: 1 without prompts.
func ShapeNorm(p Params, prompts []int) float64 {
	var model, shaped float64
	for _, n := range prompts {
		for done := 0; done < n; {
			k := n - done
			if p.MaxBatchedTokens > 0 {
				k = min(k, p.MaxBatchedTokens)
			}
			w := Work{Done: done, N: k}
			d, e := float64(done), float64(done+k)
			model += p.PrefillPerToken*float64(k) + p.PrefillQuadratic*(e*e-d*d)
			shaped += shapedCompute(p, w)
			done += k
		}
	}
	if shaped == 0 {
		return 1
	}
	return model / shaped
}

// hiddenFactor is the hidden-cache scenario's prefill-compute factor for a prompt on this
// pod: 1 − HiddenHitShare for a hit, else the factor that keeps the mean at 1. Hits depend
// on the seed, the pod and the prompt's first block, so every policy meets the same ones.
func (x *Perturbation) hiddenFactor(s *Seq) float64 {
	var key uint64
	if len(s.Hashes) > 0 {
		key = s.Hashes[0]
	} else {
		key = uint64(s.Prompt)
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%d", x.seed, x.podID, key)
	u := float64(h.Sum64()>>11) / (1 << 53)
	return HiddenFactor(u)
}

// HiddenFactor maps a uniform draw u in [0, 1) to the hidden-cache prefill factor.
func HiddenFactor(u float64) float64 {
	if u < HiddenHitProb {
		return 1 - HiddenHitShare
	}
	return (1 - HiddenHitProb*(1-HiddenHitShare)) / (1 - HiddenHitProb)
}

// Cost is the perturbed length of an iteration carrying work for seqs (work[i] is seqs[i]'s),
// whose calibrated length is IterationSeconds(p, work).
func (x *Perturbation) Cost(work []Work, seqs []*Seq) float64 {
	base := IterationSeconds(x.p, work)
	secs := base
	if x.set.has(ScenarioShape) || x.set.has(ScenarioHiddenCache) {
		var compute, memory, fixed float64
		memory = x.p.DecodeBase
		for i, w := range work {
			d, e := float64(w.Done), float64(w.Done+w.N)
			c := x.p.PrefillPerToken*float64(w.N) + x.p.PrefillQuadratic*(e*e-d*d)
			if w.N > 1 || w.First {
				// a prompt chunk
				if x.set.has(ScenarioShape) {
					c = shapedCompute(x.p, w) * x.norm
				}
				if x.set.has(ScenarioHiddenCache) && i < len(seqs) {
					c *= x.hiddenFactor(seqs[i])
				}
			}
			compute += c
			memory += x.p.DecodePerSeq + x.p.DecodePerKVToken*d
			if w.First {
				fixed += x.p.PrefillBase
			}
		}
		secs = max(compute, memory) + fixed
	}
	secs *= x.slow
	if x.set.has(ScenarioJitter) {
		secs *= math.Exp(JitterSigma*x.rng.NormFloat64() - JitterSigma*JitterSigma/2)
	}
	x.Stalled = false
	if x.set.has(ScenarioStalls) {
		if x.rng.Float64() < StallProb {
			secs *= StallFactor
			x.Stalled = true
			x.Stalls++
		} else {
			secs *= x.stallX
		}
	}
	x.BaseSeconds += base
	x.Seconds += secs
	return secs
}

// Ratio is the realised cost ratio: perturbed over calibrated seconds (1 before any iteration).
func (x *Perturbation) Ratio() float64 {
	if x == nil || x.BaseSeconds == 0 {
		return 1
	}
	return x.Seconds / x.BaseSeconds
}
