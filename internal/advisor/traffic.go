package advisor

import (
	"math"
	"slices"
	"time"

	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// traffic is one model's pods and the window's completions on them, sorted by stage.
type traffic struct {
	current Split
	// mix is every request; pdMix those served by a pair, wdMix those run whole on a
	// decode pod, stdMix those run on a standard pod
	mix, pdMix, wdMix, stdMix []request
	// prefillBusy is the seconds the prefill pods had a prompt of legged in (waiting or
	// prefilling): the measure of the union of those requests' prefill legs, per pod
	prefillBusy float64
	legged      []request
}

// trafficOf sorts the completions on the model's pods by stage: the pods are eps (the
// current split) and those seen in the window since (a pod that left still counts).
func trafficOf(model string, eps []*pool.Endpoint, pods map[string]podInfo, all []sample) traffic {
	var t traffic
	for _, e := range eps {
		switch e.Role {
		case pool.RolePrefill:
			t.current.Prefill++
		case pool.RoleDecode:
			t.current.Decode++
		default:
			t.current.Standard++
		}
	}
	legs := map[string][][2]time.Time{}
	for _, s := range all {
		p, ok := pods[s.serve]
		if !ok || p.model != model {
			continue
		}
		q := request{prompt: float64(s.prompt), cached: float64(s.cached), output: float64(s.output)}
		t.mix = append(t.mix, q)
		switch {
		case s.kind == outcome.KindPD:
			t.pdMix = append(t.pdMix, q)
			if !s.prefilled.IsZero() {
				legs[s.prefill] = append(legs[s.prefill], [2]time.Time{s.picked, s.prefilled})
				t.legged = append(t.legged, q)
			}
		case p.role == pool.RoleDecode:
			t.wdMix = append(t.wdMix, q)
		default:
			t.stdMix = append(t.stdMix, q)
		}
	}
	for _, ls := range legs {
		t.prefillBusy += union(ls)
	}
	return t
}

// union is the seconds the intervals cover.
func union(ls [][2]time.Time) float64 {
	slices.SortFunc(ls, func(a, b [2]time.Time) int { return a[0].Compare(b[0]) })
	total := 0.0
	var end time.Time
	for _, l := range ls {
		start := l[0]
		if start.Before(end) {
			start = end
		}
		if l[1].After(start) {
			total += l[1].Sub(start).Seconds()
			end = l[1]
		}
	}
	return total
}

// saturation is each stage's load over the load at which it would just meet the objectives,
// each stage priced on the requests it served: the prefill pods' prompts against their TTFT
// capacity; for the decode pods (the PD requests' decodes and the prompts run whole there)
// and the standard pods, the inverse of the factor their load could grow by before their
// TTFT, TPOT or KV would miss.
func (t traffic) saturation(e *engine, ob objectives, span float64) Saturation {
	rate := func(xs []request, n int) float64 { return float64(len(xs)) / span / float64(n) }
	pd, wd, st := e.mix(t.pdMix, ob), e.mix(t.wdMix, ob), e.mix(t.stdMix, ob)
	inverse := func(load func(scale float64) decoding) float64 {
		f := highest(math.Inf(1), func(x float64) bool { return load(x).ok() })
		if f <= 1/MaxSaturation {
			return MaxSaturation
		}
		return 1 / f
	}
	var s Saturation
	if n := t.current.Prefill; n > 0 && pd.n > 0 {
		s.Prefill = MaxSaturation
		if pd.prefillRate > 0 {
			s.Prefill = min(rate(t.pdMix, n)/pd.prefillRate, MaxSaturation)
		}
	}
	if n := t.current.Decode; n > 0 && pd.n+wd.n > 0 {
		rpd, rwd := rate(t.pdMix, n), rate(t.wdMix, n)
		s.Decode = inverse(func(x float64) decoding { return decoding{pd: pd, rPD: x * rpd, whole: wd, rW: x * rwd} })
	}
	if n := t.current.Standard; n > 0 && st.n > 0 {
		r := rate(t.stdMix, n)
		s.Standard = inverse(func(x float64) decoding { return decoding{whole: st, rW: x * r} })
	}
	return s
}

// wholeQuantile is the quantile of the prompts run whole that bounds the prompts the advisor
// lets the router run whole (the longest few are the exception, not the rule).
const wholeQuantile = 0.9

// longestWhole is the prompt length up to which the router runs prompts whole: the
// wholeQuantile of the prompts it ran whole in the window (0 when it ran none).
func (t traffic) longestWhole() float64 {
	n := len(t.wdMix) + len(t.stdMix)
	if n == 0 {
		return 0
	}
	ps := make([]float64, 0, n)
	for _, xs := range [][]request{t.wdMix, t.stdMix} {
		for _, q := range xs {
			ps = append(ps, q.prompt)
		}
	}
	slices.Sort(ps)
	return ps[min(n-1, int(wholeQuantile*float64(n)))]
}
