package pd

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// The predictive policies' view of a request: its latency objectives, and the options it
// may be routed to (a PD pair, its prompt run whole on a decode pod, a standard pod), each
// with a predicted TTFT and TPOT from the online per-pod models (package latency).

// Objective is a request's latency objectives in seconds: x-slo-ttft-ms / x-slo-tpot-ms,
// else the profile's sloTTFTMs / sloTPOTMs, else TANDEM_SLO_TTFT_MS / TANDEM_SLO_TPOT_MS,
// else the reference values (1 s, 50 ms), which weigh the costs but never shed.
type Objective struct {
	TTFT, TPOT float64
	// HasTTFT: a TTFT objective was set (by the request, its profile or the gateway).
	HasTTFT bool
	// Sheddable: the request may be refused (429) when nothing is predicted to meet its
	// TTFT objective (the profile's sheddable, or an InferenceObjective of negative priority).
	Sheddable bool
}

// Reference objectives for requests without one.
const (
	ReferenceTTFT = 1.0
	ReferenceTPOT = 0.050
)

// objectiveOf resolves the request's objectives. A malformed header is a 400 naming it.
func (c *Cascade) objectiveOf(cy *picker.Cycle) (Objective, error) {
	o := Objective{TTFT: ReferenceTTFT, TPOT: ReferenceTPOT, Sheddable: cy.Resolved.Routing.Sheddable}
	if d := cy.Resolved.PD.SLOTTFT; d > 0 {
		o.TTFT, o.HasTTFT = d.Seconds(), true
	}
	if d := cy.Resolved.PD.SLOTPOT; d > 0 {
		o.TPOT = d.Seconds()
	}
	for _, h := range []struct {
		name string
		dst  *float64
		has  *bool
	}{{wire.HeaderSLOTTFT, &o.TTFT, &o.HasTTFT}, {wire.HeaderSLOTPOT, &o.TPOT, nil}} {
		raw := strings.TrimSpace(cy.Req.Header(h.name))
		if raw == "" {
			continue
		}
		ms, err := strconv.ParseFloat(raw, 64)
		if err != nil || !(ms > 0) || math.IsInf(ms, 0) || ms > 1e9 {
			return o, apierror.BadRequest("bad_slo", h.name,
				"%s=%q: want a positive number of milliseconds, e.g. %s: 500", h.name, raw, h.name)
		}
		*h.dst = ms / 1000
		if h.has != nil {
			*h.has = true
		}
	}
	if name := strings.TrimSpace(cy.Req.Header(wire.HeaderInferenceObjective)); name != "" && c.objectives != nil {
		if prio, ok := c.objectives.Priority(cy.Snap, name); ok && prio < 0 {
			o.Sheddable = true
		}
	}
	return o, nil
}

// Objectives resolves an InferenceObjective's priority by name (GIE: negative priorities
// are sheddable). The pool sources implement it.
type Objectives interface {
	Priority(snap *pool.Snapshot, name string) (priority int, ok bool)
}

// promptOn is the request's prompt as a pod holding matchPct % of it in its prefix cache
// sees it.
func promptOn(tokens int, matchPct float64) latency.Prompt {
	return latency.Prompt{Tokens: tokens, Cached: int(float64(tokens) * min(max(matchPct, 0), 100) / 100)}
}

// Option is one place a request may go, with its predicted latencies (seconds).
type Option struct {
	Kind outcome.Kind
	// Prefill is the prefill pod of a PD option (nil: the destination runs the prompt).
	Prefill, Destination *pool.Endpoint
	// Prompt is the prompt as the pod that prefills it sees it; Service its predicted
	// prefill seconds there.
	Prompt  latency.Prompt
	Service float64
	// TTFT and TPOT are predicted for this request; Delay is what its prefill costs the
	// routes that will queue behind it on that pod; Cost is (TTFT + Delay)/TTFT objective +
	// TPOT/TPOT objective.
	TTFT, TPOT, Delay, Cost float64
	// Step names what chose it ("" for the pair).
	Step string
	// Distance is a pair's topology distance class (-1: unknown).
	Distance int

	forecast *latency.Forecast // the destination's, for a whole option
}

// Placement is what a placement decider sees after step 5 chose the pair: the request,
// its objectives, the candidates and the best option so far. Inside the critical section.
// Decode and Combined are shared by concurrent picks of the snapshot: read them, never
// reorder or write them.
type Placement struct {
	Cycle        *picker.Cycle
	Objective    Objective
	PromptTokens int
	// Match is the prompt's prefix match (%) per endpoint key (nil when none was computed).
	Match map[string]float64
	// Decode are the decode candidates of complete rolesets; Combined the standard pods.
	Decode, Combined []*pool.Endpoint
	// DecodeForecasts, when not nil, are Decode's latency forecasts (entries not yet read
	// are zero), shared with the decode scorer.
	DecodeForecasts []latency.Forecast
	Best            Option
	// Shed: refuse the request (429); set by a decider when nothing meets its objective.
	Shed bool
	// Notes explain the deciders' choices for the trace.
	Notes []string
}

// PlacementDecider may move a request from its pair to a better option (its prompt run
// whole on a decode pod, a standard pod) or shed it, by predicted latency. It reports
// whether it changed p.
type PlacementDecider interface {
	picker.Plugin
	Place(p *Placement) bool
}

// predictor is the models as the PD plugins read them.
type predictor struct{ m *latency.Models }

// pairOption predicts the pair (prefill pod pp with prompt match pct, decode pod dp at
// topology distance class dist, -1 unknown) from their forecasts (nil: read now).
func (pr predictor) pairOption(o Objective, tokens int, pp *pool.Endpoint, fp *latency.Forecast, pct float64, dp *pool.Endpoint, fd *latency.Forecast, dist int) Option {
	fp, fd = pr.read(pp, fp), pr.read(dp, fd)
	p := promptOn(tokens, pct)
	svc := fp.Service(p)
	end := fp.Wait() + svc
	tpot, handover := fd.TPOTAndHandoverAt(tokens, end, dist)
	ttft := end + handover
	delay := fp.Delay(svc)
	return Option{Kind: outcome.KindPD, Prefill: pp, Destination: dp, Prompt: p, Service: svc, Distance: dist,
		TTFT: ttft, TPOT: tpot, Delay: delay, Cost: (ttft+delay)/o.TTFT + tpot/o.TPOT}
}

// wholeOption predicts the request run whole on e: its prefill waits for e's booked
// prefill work, and its prefill load stretches every decode on e.
func (pr predictor) wholeOption(o Objective, tokens int, e *pool.Endpoint, fe *latency.Forecast, pct float64, step string) Option {
	fe = pr.read(e, fe)
	w := predictWhole(o, tokens, fe, pct)
	return Option{Kind: outcome.KindWhole, Destination: e, Prompt: w.prompt, Service: w.svc, forecast: fe,
		TTFT: w.ttft, TPOT: w.tpot, Delay: w.delay, Cost: w.cost, Step: step}
}

// whole is a whole option's prediction, before it is made an Option (a decider weighing
// many pods makes one only for the best).
type whole struct {
	prompt                       latency.Prompt
	svc, ttft, tpot, delay, cost float64
}

func predictWhole(o Objective, tokens int, fe *latency.Forecast, pct float64) whole {
	p := promptOn(tokens, pct)
	svc := fe.Service(p)
	ttft := fe.Wait() + svc
	tpot := fe.TPOT(tokens, svc)
	delay := fe.Delay(svc)
	return whole{prompt: p, svc: svc, ttft: ttft, tpot: tpot, delay: delay, cost: (ttft+delay)/o.TTFT + tpot/o.TPOT}
}

// weighs reports whether an alternative to best (a prompt run whole on a decode or standard
// pod), predicted at tpot, is weighed at all: its TPOT stays within headroom × the objective
// or, when best is predicted to miss the TPOT objective, it is at least predicted below best's
// (a pair's decode pod is held to the objective as a prompt run whole is, so an alternative
// that misses by less still counts). The caller checks its stall fits as well.
func weighs(tpot float64, best Option, o Objective, headroom float64) bool {
	return tpot <= headroom*o.TPOT || (best.TPOT > o.TPOT && tpot < best.TPOT)
}

// replaces reports whether a weighed alternative of the given cost and predicted TTFT and
// TPOT should take best's place: it is cheaper, or best is predicted to miss the TPOT
// objective and it is predicted to meet both objectives.
func replaces(cost, ttft, tpot float64, best Option, o Objective) bool {
	return cost < best.Cost || (best.TPOT > o.TPOT && ttft <= o.TTFT && tpot <= o.TPOT)
}

// meetsBoth reports whether opt is predicted to meet both objectives.
func meetsBoth(opt Option, o Objective) bool { return opt.TTFT <= o.TTFT && opt.TPOT <= o.TPOT }

// stalls reports whether a prompt of svc prefill seconds run whole on the pod of fe stalls
// its decodes by more than the tightest of them can absorb within its TPOT objective (its
// prefill beyond one decode step).
func stalls(fe *latency.Forecast, svc float64) bool {
	return !(svc-fe.Step(0) <= fe.StallRoom()) // a NaN stalls
}

func (pr predictor) read(e *pool.Endpoint, f *latency.Forecast) *latency.Forecast {
	if f != nil && f.Valid() {
		return f
	}
	g := pr.m.ForecastOf(e)
	return &g
}

// stallFits reports whether opt, a prompt run whole on its destination, stalls the decodes
// there (its prefill beyond one decode step) by no more than the tightest of them can
// absorb within its TPOT objective.
func (pr predictor) stallFits(opt Option) bool {
	return !stalls(pr.read(opt.Destination, opt.forecast), opt.Service)
}

// charge books the chosen option on the models under the route's outcome ID.
func (pr predictor) charge(id uint64, opt Option, o Objective, maxTokens int) {
	prefillOn := opt.Destination
	if opt.Prefill != nil {
		prefillOn = opt.Prefill
	}
	pr.m.Charge(id, latency.Charge{Kind: opt.Kind, Prefill: prefillOn.Key(), Destination: opt.Destination.Key(),
		Prompt: opt.Prompt, Service: opt.Service, TTFT: opt.TTFT, TPOT: opt.TPOT, TPOTObjective: o.TPOT, MaxTokens: maxTokens,
		Distance: distanceCharge(opt)})
}

// traceOption writes an option's prediction, and the recent error of the pods' models,
// into the trace.
func (pr predictor) traceOption(tr *picker.Trace, opt Option) {
	if tr.Scores == nil {
		tr.Scores = map[string]string{}
	}
	tr.ScoreDirection = picker.LowerIsBetter
	tr.Scores["predicted_ttft_ms"] = fmt.Sprintf("%.1f", opt.TTFT*1000)
	tr.Scores["predicted_tpot_ms"] = fmt.Sprintf("%.2f", opt.TPOT*1000)
	for _, e := range []*pool.Endpoint{opt.Prefill, opt.Destination} {
		if e == nil {
			continue
		}
		if f, bias, ok := pr.m.PodError(e.Key()); ok {
			tr.Scores["ttft_error "+e.Key()] = fmt.Sprintf("x%.2f bias %.2f", f, bias)
		}
	}
}

// distanceCharge is a PD option's distance class as latency.Charge takes it (class + 1; 0:
// unknown).
func distanceCharge(opt Option) int {
	if opt.Kind != outcome.KindPD || opt.Distance < 0 {
		return 0
	}
	return opt.Distance + 1
}
