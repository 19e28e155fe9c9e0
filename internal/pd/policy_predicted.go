package pd

import (
	"sync"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/pool"
)

// The predictive score policies, in the units of the request's objectives, so that the pair
// step adds them as they are (AbsoluteCost): a pair costs predicted TTFT ÷ the TTFT
// objective + predicted TPOT ÷ the TPOT objective.
const (
	PolicyPredictedTTFT = config.PolicyPredictedTTFT
	PolicyPredictedTPOT = config.PolicyPredictedTPOT
)

// AbsoluteCost is implemented by policies whose costs compare across batches and add up
// between the two sides: when both of a request's policies do, step 5 pairs on
// prefill cost + decode cost instead of the seed's batch-normalised sum.
type AbsoluteCost interface {
	AbsoluteCost()
}

// registerPredictive registers predicted_ttft (prefill) and predicted_tpot (decode) on the
// cascade's registries, predicting from m, and makes m the models the cascade's predictive
// chain (pd-predictive) and placement deciders read; m forgets the endpoints that leave the
// pool when the cascade's deps do. New calls it, before the cascade is shared.
func (c *Cascade) registerPredictive(m *latency.Models) {
	c.models = m
	c.deps.OnForget(m.Forget)
	c.Policies().RegisterPrefill(predictedTTFT{m})
	c.Policies().RegisterDecode(predictedTPOT{m})
}

// predictedTTFT scores a prefill pod by when the prefill leg is predicted to end — the
// prefill work booked on the pod (its busy-until ledger) plus the pod's fitted prefill time
// of the prompt's uncached part — plus the delay that prefill adds to the prompts that will
// queue behind it there, ÷ the TTFT objective.
type predictedTTFT struct{ m *latency.Models }

func (predictedTTFT) Name() string     { return PolicyPredictedTTFT }
func (predictedTTFT) UsesPrefix() bool { return true }
func (predictedTTFT) AbsoluteCost()    {}
func (predictedTTFT) ForecastOnly()    {}

func (p predictedTTFT) Score(b *PrefillBatch, i int) float64 {
	f := b.forecast(p.m, i)
	svc := f.Service(promptOn(b.PromptTokens, b.Pods[i].MatchPct))
	return (f.Wait() + svc + f.Delay(svc)) / ttftOf(b.Objective)
}

// forecast is pod i's latency forecast; the batch's are read at once, once per request.
func (b *PrefillBatch) forecast(m *latency.Models, i int) *latency.Forecast {
	if b.fc == nil {
		b.fc = forecasts(m, len(b.Pods), func(i int) *pool.Endpoint { return b.Pods[i].Endpoint })
	}
	return &b.fc[i]
}

// forecast is pod i's latency forecast; the batch's are read at once, once per request.
func (b *DecodeBatch) forecast(m *latency.Models, i int) *latency.Forecast {
	if b.fc == nil {
		b.fc = forecasts(m, len(b.Pods), func(i int) *pool.Endpoint { return b.Pods[i].Endpoint })
	}
	return &b.fc[i]
}

// forecastBuffers recycles the batches' forecast slices (about 150 bytes a pod, the largest
// allocation of a predictive pick): the roleset handler returns them when its Result is
// made, after which nothing reads them.
var forecastBuffers sync.Pool

// forecasts reads the models of n endpoints into a recycled slice (every entry is written).
func forecasts(m *latency.Models, n int, at func(i int) *pool.Endpoint) []latency.Forecast {
	var fc []latency.Forecast
	if p, ok := forecastBuffers.Get().(*[]latency.Forecast); ok && cap(*p) >= n {
		fc = (*p)[:n]
	} else {
		fc = make([]latency.Forecast, n)
	}
	m.ForecastEndpoints(n, at, fc)
	return fc
}

// recycleForecasts returns a batch's forecast slice; fc must not be read afterwards.
func recycleForecasts(fc []latency.Forecast) {
	if cap(fc) > 0 {
		forecastBuffers.Put(&fc)
	}
}

// predictedTPOT scores a decode pod by the TPOT the request is predicted to see there
// (the pod's fitted decode step at its requests and KV tokens plus this one) ÷ the TPOT
// objective, plus the predicted hand-over (the prefill work booked on the pod, which its
// decode leg queues behind, the KV transfer, the first step) ÷ the TTFT objective.
// The fast paths never decide under it, and a pod Tandem never saw is scored from the
// models' defaults rather than the seed's cold-start score.
type predictedTPOT struct{ m *latency.Models }

func (predictedTPOT) Name() string    { return PolicyPredictedTPOT }
func (predictedTPOT) ColdStart() bool { return false }
func (predictedTPOT) FastPath() bool  { return false }
func (predictedTPOT) AbsoluteCost()   {}
func (predictedTPOT) DrainFree()      {}
func (predictedTPOT) ForecastOnly()   {}

func (p predictedTPOT) Score(b *DecodeBatch, i int) float64 {
	tpot, handover := b.forecast(p.m, i).TPOTAndHandover(b.PromptTokens, 0)
	return tpot/tpotOf(b.Objective) + handover/ttftOf(b.Objective)
}

// ttftOf and tpotOf are the objectives with the reference values for a zero Objective (a
// batch built outside the roleset handler).
func ttftOf(o Objective) float64 {
	if o.TTFT > 0 {
		return o.TTFT
	}
	return ReferenceTTFT
}

func tpotOf(o Objective) float64 {
	if o.TPOT > 0 {
		return o.TPOT
	}
	return ReferenceTPOT
}
