package pd

import (
	"math"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Round coefficients, so the predictions can be worked out by hand: prefill 10 ms + 0.1 ms
// per uncached token (no attention term); hand-over 5 ms + one decode step; a decode step of
// 10 ms + 1 ms per request on the pod (KV tokens cost nothing); requests decode for 10 s.
var handDefaults = latency.Defaults{PrefillBase: 0.010, PrefillPerToken: 1e-4, HandoverBase: 0.005,
	StepBase: 0.010, StepPerRequest: 0.001, DecodeSeconds: 10}

// predictRig is a cascade with latency models on a manual clock, and its recorder.
type predictRig struct {
	c     *Cascade
	m     *latency.Models
	rec   *outcome.Recorder
	clock *load.ManualClock
}

func newPredictRig() *predictRig {
	clock := load.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m := latency.New(latency.Options{Clock: clock, Defaults: handDefaults})
	c := New(Options{Models: m})
	rec := outcome.NewRecorder(clock)
	rec.Subscribe(m)
	return &predictRig{c: c, m: m, rec: rec, clock: clock}
}

// book charges s seconds of prefill on prefill (a PD route to decode) or, with decode
// empty, a whole request on prefill.
func (r *predictRig) book(prefill, decode *pool.Endpoint, s float64) *outcome.Tracker {
	kind, dest := outcome.KindPD, decode
	if decode == nil {
		kind, dest = outcome.KindWhole, prefill
	}
	pk := ""
	if kind == outcome.KindPD {
		pk = prefill.Key()
	}
	tr := r.rec.Start(kind, pk, dest.Key(), 1000)
	r.m.Charge(tr.ID(), latency.Charge{Kind: kind, Prefill: prefill.Key(), Destination: dest.Key(), Prompt: latency.Prompt{Tokens: 1000}, Service: s})
	return tr
}

func ep(name, role string) *pool.Endpoint {
	return pool.NewEndpoint("ns", name, "10.0.0."+name[len(name)-1:], 8000, 0, map[string]string{pool.LabelRoleName: role, pool.LabelRolesetName: "rs"}, nil)
}

// predicted_ttft: (booked wait + prefill of the uncached prompt + the delay it adds to the
// prompts that will queue behind it) ÷ the TTFT objective.
func TestPredictedTTFTPolicy(t *testing.T) {
	r := newPredictRig()
	p0, p1, p2 := ep("p0", "prefill"), ep("p1", "prefill"), ep("p2", "prefill")
	r.book(p1, ep("d9", "decode"), 0.3) // 0.3 s booked on p1, one arrival: rate 1/5 s
	pol, _ := r.c.Policies().Prefill(PolicyPredictedTTFT)
	b := &PrefillBatch{PromptTokens: 1000, Objective: Objective{TTFT: 0.5, TPOT: 0.05},
		Pods: []PrefillPod{{Endpoint: p0}, {Endpoint: p1}, {Endpoint: p2, MatchPct: 50}}}
	for i, want := range []float64{
		0.110 / 0.5, // idle: 0.01 + 0.1 = 0.11 s
		// 0.3 s ahead + 0.11 s, and the delay: rate 0.2/s × (0.3 + 0.11) s × 0.11 s = 0.00902 s
		(0.3 + 0.11 + 0.2*0.41*0.11) / 0.5,
		0.060 / 0.5, // half cached: 0.01 + 500 × 0.1 ms
	} {
		if got := pol.Score(b, i); math.Abs(got-want) > 1e-9 {
			t.Errorf("pod %d: %.6f, want %.6f", i, got, want)
		}
	}
	if !pol.UsesPrefix() {
		t.Error("predicted_ttft reads the prefix match")
	}
}

// predicted_tpot: TPOT on the pod ÷ the TPOT objective + hand-over ÷ the TTFT objective.
func TestPredictedTPOTPolicy(t *testing.T) {
	r := newPredictRig()
	d0, d1, d2 := ep("d0", "decode"), ep("d1", "decode"), ep("d2", "decode")
	for range 3 {
		r.rec.Start(outcome.KindPD, "ns/p9:8000", d1.Key(), 1000) // three requests on d1
	}
	r.book(d2, nil, 0.5) // d2 runs a 0.5 s prompt itself (one request, 0.5 s booked)
	pol, _ := r.c.Policies().Decode(PolicyPredictedTPOT)
	b := &DecodeBatch{PromptTokens: 1000, Objective: Objective{TTFT: 0.5, TPOT: 0.05},
		Pods: []DecodePod{{Endpoint: d0}, {Endpoint: d1}, {Endpoint: d2}}}
	// d2: step at 2 requests 12 ms, stretched by its booked prefill over its 10 s of
	// decoding: ρ = 0.5/10, TPOT = 0.012/0.95; hand-over = 0.5 s booked + 5 ms + that TPOT.
	tpot2 := 0.012 / 0.95
	for i, want := range []float64{
		0.011/0.05 + (0.005+0.011)/0.5, // idle: step 11 ms at 1 request (this one)
		0.014/0.05 + (0.005+0.014)/0.5, // 3 requests + this one: 14 ms
		tpot2/0.05 + (0.5+0.005+tpot2)/0.5,
	} {
		if got := pol.Score(b, i); math.Abs(got-want) > 1e-9 {
			t.Errorf("pod %d: %.6f, want %.6f", i, got, want)
		}
	}
	if pol.FastPath() || pol.ColdStart() {
		t.Error("predicted_tpot opts out of the fast paths and the cold-start score")
	}
}

// The selective decider runs a prompt whole on a decode pod when that is predicted cheaper
// than the pair and the pod's TPOT stays within the headroom; the overflow decider moves it
// to a standard pod by its mode; the shed refuses a sheddable request nothing serves in time.
func TestPlacementDeciders(t *testing.T) {
	obj := Objective{TTFT: 0.5, TPOT: 0.05, HasTTFT: true}
	type setup func(r *predictRig, p, d, dBusy, s *pool.Endpoint)
	cases := []struct {
		name      string
		setup     setup
		objective Objective
		tokens    int
		overflow  string
		wantDest  string // "" keeps the pair
		wantShed  bool
	}{
		// Pair: 0.11 s prefill + 5 ms + 11 ms step = 0.126 s, TPOT 11 ms:
		// cost 0.126/0.5 + 0.011/0.05 = 0.472. Whole on the idle decode pod d: 0.11 s,
		// TPOT 0.011/(1 − 0.11/10) = 11.12 ms: cost 0.22 + 0.2224 = 0.4424 < 0.472.
		{name: "short prompt runs on the idle decode pod", tokens: 1000, overflow: OverflowMiss, wantDest: "d"},
		// 20k tokens: 2.01 s prefill. Pair: 2.026/0.5 + 0.22 = 4.272; whole on d: TPOT
		// 0.011/(1 − 0.201) = 13.8 ms → 4.02 + 0.275 = 4.295: the pair is cheaper.
		{name: "long prompt stays disaggregated", tokens: 20000, overflow: OverflowMiss, wantDest: ""},
		// A decode pod past the headroom: 60 requests make the step 70 ms > 0.8 × 50 ms, so
		// the prompt does not run there; the pair misses the TPOT objective, so even mode
		// miss takes the idle standard pod, which meets both.
		{name: "no decode pod within the TPOT headroom", tokens: 1000, overflow: OverflowMiss, wantDest: "s",
			setup: func(r *predictRig, p, d, _, _ *pool.Endpoint) { crowd(r, p, d) }},
		// The prefill pod has 1 s booked: the pair misses the 0.5 s objective (1.126 s); the
		// idle standard pod meets it (0.11 s) → overflow, in both modes.
		{name: "miss: overflow to the standard pod", tokens: 1000, overflow: OverflowMiss, wantDest: "s",
			setup: func(r *predictRig, p, d, _, _ *pool.Endpoint) { r.book(p, d, 1.0); blockDecode(r, d) }},
		{name: "cost: overflow to the standard pod", tokens: 1000, overflow: OverflowCost, wantDest: "s",
			setup: func(r *predictRig, p, d, _, _ *pool.Endpoint) { r.book(p, d, 1.0); blockDecode(r, d) }},
		// The decode pod decodes 60 requests (a 70 ms step, past the headroom): the pair meets
		// the TTFT objective (0.11 + 0.005 + 0.071 s) but misses the TPOT one. Mode miss
		// takes the standard pod, which meets both; mode cost takes it as the cheaper one.
		{name: "miss: the pair misses the TPOT objective, overflow to the standard pod", tokens: 1000, overflow: OverflowMiss, wantDest: "s",
			setup: func(r *predictRig, p, d, _, _ *pool.Endpoint) { crowd(r, p, d) }},
		{name: "cost: the cheaper standard pod", tokens: 1000, overflow: OverflowCost, wantDest: "s",
			setup: func(r *predictRig, p, d, _, _ *pool.Endpoint) { crowd(r, p, d) }},
		// Nothing meets 0.5 s (everything has 2 s booked) and the request is sheddable: shed.
		{name: "sheddable, nothing in time: shed", tokens: 1000, overflow: OverflowMiss, wantShed: true,
			objective: Objective{TTFT: 0.5, TPOT: 0.05, HasTTFT: true, Sheddable: true},
			setup: func(r *predictRig, p, d, dBusy, s *pool.Endpoint) {
				r.book(p, d, 2)
				r.book(d, nil, 2)
				r.book(dBusy, nil, 2)
				r.book(s, nil, 2)
			}},
		// The same, not sheddable: it keeps the pair.
		{name: "not sheddable: routed anyway", tokens: 1000, overflow: OverflowMiss, wantDest: "",
			setup: func(r *predictRig, p, d, dBusy, s *pool.Endpoint) {
				r.book(p, d, 2)
				r.book(d, nil, 2)
				r.book(dBusy, nil, 2)
				r.book(s, nil, 2)
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newPredictRig()
			p, d, dBusy, s := ep("p1", "prefill"), ep("d1", "decode"), ep("d2", "decode"), ep("s1", "standard")
			// The second decode pod is always busy: a 3 s prompt booked.
			r.book(dBusy, nil, 3)
			if c.setup != nil {
				c.setup(r, p, d, dBusy, s)
			}
			o := obj
			if c.objective != (Objective{}) {
				o = c.objective
			}
			pr := predictor{r.m}
			pl := &Placement{Objective: o, PromptTokens: c.tokens, Decode: []*pool.Endpoint{d, dBusy}, Combined: []*pool.Endpoint{s},
				Best: pr.pairOption(o, c.tokens, p, nil, 0, d, nil, -1)}
			sel := &SelectiveDecider{c: r.c, headroom: defaultTPOTHeadroom}
			ovf := &SLOOverflowDecider{c: r.c, mode: c.overflow, headroom: defaultTPOTHeadroom, shed: true}
			for _, dec := range []PlacementDecider{sel, ovf} {
				dec.Place(pl)
			}
			if pl.Shed != c.wantShed {
				t.Fatalf("shed %v, want %v (notes %v)", pl.Shed, c.wantShed, pl.Notes)
			}
			got := ""
			if pl.Best.Kind == outcome.KindWhole {
				got = pl.Best.Destination.Name[:1]
			}
			if !c.wantShed && got != c.wantDest {
				t.Errorf("placed on %q (%s, cost %.4f), want %q; notes %v", got, pl.Best.Step, pl.Best.Cost, c.wantDest, pl.Notes)
			}
		})
	}
}

// blockDecode makes running the prompt on d too dear: 3 s of prefill booked there.
func blockDecode(r *predictRig, d *pool.Endpoint) { r.book(d, nil, 3) }

// crowd puts 60 requests on d: its decode step becomes 10 + 61 ms.
func crowd(r *predictRig, p, d *pool.Endpoint) {
	for range 60 {
		r.rec.Start(outcome.KindPD, p.Key(), d.Key(), 10)
	}
}

// The stall budget keeps a prompt off a pod whose decodes cannot absorb its prefill: a
// 6-token request at a 50 ms objective and an 11 ms step absorbs (0.05 − 0.011) × 5 = 0.195 s.
func TestSelectiveRespectsTheStallBudget(t *testing.T) {
	for _, c := range []struct {
		tokens int
		local  bool
	}{{1000, true}, {2500, false}} { // prefills of 0.11 s and 0.26 s (the step, 11 ms, is free)
		r := newPredictRig()
		p, d := ep("p1", "prefill"), ep("d1", "decode")
		tr := r.rec.Start(outcome.KindPD, p.Key(), d.Key(), 10)
		r.m.Charge(tr.ID(), latency.Charge{Kind: outcome.KindPD, Prefill: p.Key(), Destination: d.Key(), Prompt: latency.Prompt{Tokens: 10},
			Service: 0.011, TPOT: 0.011, TPOTObjective: 0.05, MaxTokens: 6})
		r.clock.Advance(time.Second) // p is free again
		tr.PrefillEnd(nil, true)
		o := Objective{TTFT: 10, TPOT: 0.05} // a lax TTFT: only the stall can keep it off d
		pr := predictor{r.m}
		pl := &Placement{Objective: o, PromptTokens: c.tokens, Decode: []*pool.Endpoint{d}, Best: pr.pairOption(o, c.tokens, p, nil, 0, d, nil, -1)}
		pl.Best.Cost = math.Inf(1) // the pair is never cheaper here
		(&SelectiveDecider{c: r.c, headroom: 1}).Place(pl)
		if local := pl.Best.Kind == outcome.KindWhole; local != c.local {
			t.Errorf("%d tokens: local %v, want %v (room %.3f s)", c.tokens, local, c.local, r.m.StallRoom(d.Key()))
		}
	}
}

// Every option's TPOT is held to the objective, a pair's decode pod included: a pair whose
// decode pod is predicted to miss the TPOT objective gives way to an option predicted to meet
// both objectives (a standard pod, a decode pod running the prompt), even a dearer one, in
// either overflow mode, and to a cheaper one predicted to miss by less; with no such option it
// stays. While the pair misses, the headroom does not keep out an option below its TPOT.
func TestPairHeldToTheTPOTObjective(t *testing.T) {
	obj := Objective{TTFT: 0.5, TPOT: 0.05, HasTTFT: true}
	for _, c := range []struct {
		name     string
		overflow string
		crowd    int     // requests decoding on the pair's decode pod (60: a 71 ms step, 45: 56 ms)
		stdReqs  int     // requests decoding on the standard pod
		stdBook  float64 // prefill seconds booked on it
		want     string
	}{
		{name: "miss mode: the pair meets the TTFT objective, not the TPOT one", overflow: OverflowMiss, crowd: 60, want: "s"},
		// Pair: TTFT 0.171 s, TPOT 56 ms, cost 1.46. Standard pod: 20 requests and 0.3 s
		// booked, TTFT 0.41 s and TPOT 32 ms, cost 1.49: dearer, and it meets both.
		{name: "cost mode: a dearer standard pod that meets both", overflow: OverflowCost, crowd: 45, stdReqs: 20, stdBook: 0.3, want: "s"},
		{name: "nothing meets both: the pair stays", overflow: OverflowCost, crowd: 45, stdBook: 2, want: ""},
		{name: "beyond the headroom, within the objective, while the pair misses it", overflow: OverflowCost, crowd: 60, stdReqs: 34, want: "s"},
		{name: "missing the TPOT objective by less than the pair, and cheaper", overflow: OverflowCost, crowd: 60, stdReqs: 50, want: "s"},
		{name: "missing the TPOT objective by less than the pair, but dearer", overflow: OverflowCost, crowd: 60, stdReqs: 50, stdBook: 0.6, want: ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newPredictRig()
			p, d, dBusy, s := ep("p1", "prefill"), ep("d1", "decode"), ep("d2", "decode"), ep("s1", "standard")
			r.book(dBusy, nil, 3) // the other decode pod is busy for 3 s
			for range c.crowd {
				r.rec.Start(outcome.KindPD, p.Key(), d.Key(), 10)
			}
			for range c.stdReqs {
				r.rec.Start(outcome.KindWhole, "", s.Key(), 10)
			}
			if c.stdBook > 0 {
				r.book(s, nil, c.stdBook)
			}
			pr := predictor{r.m}
			pl := &Placement{Objective: obj, PromptTokens: 1000, Decode: []*pool.Endpoint{d, dBusy}, Combined: []*pool.Endpoint{s},
				Best: pr.pairOption(obj, 1000, p, nil, 0, d, nil, -1)}
			pair := pl.Best
			for _, dec := range []PlacementDecider{
				&SelectiveDecider{c: r.c, headroom: defaultTPOTHeadroom},
				&SLOOverflowDecider{c: r.c, mode: c.overflow, headroom: defaultTPOTHeadroom, shed: true},
			} {
				dec.Place(pl)
			}
			got := ""
			if pl.Best.Kind == outcome.KindWhole {
				got = pl.Best.Destination.Name[:1]
			}
			whole := pr.wholeOption(obj, 1000, s, nil, 0, StepStandardCheaper)
			t.Logf("pair: ttft %.0f ms, tpot %.1f ms, cost %.3f; standard: ttft %.0f ms, tpot %.1f ms, cost %.3f, stall fits %v", pair.TTFT*1000, pair.TPOT*1000, pair.Cost, whole.TTFT*1000, whole.TPOT*1000, whole.Cost, pr.stallFits(whole))
			if got != c.want {
				t.Errorf("placed on %q; want %q (pair: ttft %.0f ms, tpot %.0f ms, cost %.3f; standard: ttft %.0f ms, tpot %.0f ms, cost %.3f); notes %v",
					got, c.want, pair.TTFT*1000, pair.TPOT*1000, pair.Cost, whole.TTFT*1000, whole.TPOT*1000, whole.Cost, pl.Notes)
			}
		})
	}
}

// While the pair's decode pod is predicted to miss the TPOT objective, a decode pod whose TPOT
// is beyond the headroom but below the pair's runs the prompt itself when that is cheaper; among
// standard pods, one predicted to meet both objectives is taken before a cheaper one that misses.
func TestBelowAMissingPair(t *testing.T) {
	obj := Objective{TTFT: 0.5, TPOT: 0.05, HasTTFT: true}
	start := func(r *predictRig, kind outcome.Kind, p, d *pool.Endpoint, n int) {
		pk := ""
		if p != nil {
			pk = p.Key()
		}
		for range n {
			r.rec.Start(kind, pk, d.Key(), 10)
		}
	}
	t.Run("decode_local beyond the headroom", func(t *testing.T) {
		r := newPredictRig()
		p, d, d2 := ep("p1", "prefill"), ep("d1", "decode"), ep("d2", "decode")
		crowd(r, p, d)                      // the pair's decode pod: a 71 ms step
		start(r, outcome.KindPD, p, d2, 45) // d2: a 56 ms step, beyond 0.8 × 50 ms
		pr := predictor{r.m}
		pl := &Placement{Objective: obj, PromptTokens: 1000, Decode: []*pool.Endpoint{d, d2}, Best: pr.pairOption(obj, 1000, p, nil, 0, d, nil, -1)}
		pair := pl.Best
		(&SelectiveDecider{c: r.c, headroom: defaultTPOTHeadroom}).Place(pl)
		if pl.Best.Kind != outcome.KindWhole || pl.Best.Destination != d2 {
			w := pr.wholeOption(obj, 1000, d2, nil, 0, StepDecodeLocal)
			t.Errorf("placed %s on %s; want whole on d2 (pair: tpot %.1f ms, cost %.3f; d2: tpot %.1f ms, cost %.3f)",
				pl.Best.Kind, pl.Best.Destination.Name, pair.TPOT*1000, pair.Cost, w.TPOT*1000, w.Cost)
		}
	})
	t.Run("meeting both before cheaper", func(t *testing.T) {
		r := newPredictRig()
		p, d, s1, s2 := ep("p1", "prefill"), ep("d1", "decode"), ep("s1", "standard"), ep("s2", "standard")
		crowd(r, p, d)
		blockDecode(r, ep("d2", "decode"))
		start(r, outcome.KindWhole, nil, s1, 50) // TPOT 62 ms, cost 1.45: cheaper, misses
		start(r, outcome.KindWhole, nil, s2, 20) // with 0.3 s booked: TTFT 0.41 s, TPOT 33 ms, cost 1.51
		r.book(s2, nil, 0.3)
		pr := predictor{r.m}
		pl := &Placement{Objective: obj, PromptTokens: 1000, Decode: []*pool.Endpoint{d}, Combined: []*pool.Endpoint{s1, s2},
			Best: pr.pairOption(obj, 1000, p, nil, 0, d, nil, -1)}
		(&SLOOverflowDecider{c: r.c, mode: OverflowCost, headroom: defaultTPOTHeadroom, shed: true}).Place(pl)
		if pl.Best.Destination != s2 {
			t.Errorf("placed on %s; want s2, the standard pod predicted to meet both objectives; notes %v", pl.Best.Destination.Name, pl.Notes)
		}
	})
}
