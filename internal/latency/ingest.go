package latency

import (
	"math"

	"github.com/tandem-epp/tandem/internal/metrics"
)

// The engine-metrics ingestion: a pod takes each newer scraped sample of its engine, keeps its
// running and waiting requests and KV use, feeds the accumulators of engine.go, and fits its
// prefill and step models on the engine's histograms when nothing better is known.

// ingest takes a newer scraped sample: the engine's running and waiting requests and KV
// use, its prefill-time histogram (prefill model) and inter-token histogram (step model).
func (q *pod) ingest(s *metrics.Sample) {
	q.sampleAt = s.UpdatedAt
	q.hasEng = !s.Stale
	q.engRunning, q.engWaiting, q.engKV = 0, 0, 0
	if s.Stale {
		q.queue.unseenWait = 0
		return
	}
	if s.HasRunning {
		q.engRunning = s.Running
	}
	if s.HasWaiting {
		q.engWaiting = s.Waiting
	}
	if s.HasKVUsage && s.NumGPUBlocks > 0 && s.BlockSize > 0 {
		q.engKV = s.KVUsage * float64(s.NumGPUBlocks*s.BlockSize)
	}
	q.slots.learn(q.engRunning, q.engWaiting)
	prompts, havePrompts := q.prompts.took(s) // prompt tokens the engine took in the interval
	// The engine's prefill-time histogram: the mean of the prefills it finished in the
	// scrape interval. It is the only direct view of a prefill pod's service time when a
	// decode-side sidecar runs the legs (Tandem then only infers their ends), so it is fitted
	// there, at the mean uncached prompt of the pod's recent charges; with the hand-off's
	// own observations it is not needed. A pod no strategy books (the PD policies but
	// pd-predictive) has its engPrefill fitted at the mean prompt the engine reports.
	if s.HistogramsLifetime {
		// The first scrape's means are over the engine's whole life (it may have been
		// overloaded hours ago): nothing of this interval to fit or to measure, but a better
		// start than the defaults for a pod nothing was learned about yet.
		q.startFromLifetime(s)
		q.queue = unseenQueue{}
		q.ends = intervalEnds{}
		return
	}
	if mean, ok := prefillMean(s); ok {
		q.histPrefill++
		// With the hand-off's own observations it is not needed, but for an interval none of
		// whose ends could be fitted (they were booked behind work others routed there).
		if q.ends.n > 0 && (q.directPrefill == 0 || q.ends.observed == 0) {
			x := q.ends.mean()
			fitRelative(&q.prefill, x, q.serviceAt(x), mean)
		}
		if count := prefillCount(s); q.booked == 0 && havePrompts && count > 0 {
			if tokens := q.prompts.mean(prompts, count); tokens >= 1 {
				x := prefillX(Prompt{Tokens: int(tokens)})
				fitRelative(&q.engPrefill, x, q.engService(x), mean)
			}
		}
	}
	// The engine's inter-token histogram: the mean gap between the tokens of the requests it
	// decoded in the interval. The streams Tandem routed here are the cleaner view (the
	// prefill work that shared the iterations is taken out of each), so it is fitted only
	// until the first of them: a pod whose traffic another replica routes, or whose answers
	// are not streamed, still learns its step. The prefill load this replica knows of is
	// taken out the same way, at the engine's running requests and KV.
	if s.HasInterTokenMean && s.InterTokenCount > 0 && s.InterTokenMean > 0 && q.streamSteps == 0 && q.engRunning > 0 {
		rho := math.Min(q.rhoAtNow(s.UpdatedAt), maxRho)
		q.fitStep(q.engRunning, q.engKV, s.InterTokenMean*(1-rho))
	}
	q.queue.seen(s, q.backlog(s.UpdatedAt), q.unknownWaiting(), min(float64(max(q.ledger.charges, q.pending)), q.engRunning))
	q.ends = intervalEnds{}
}

// The bounds of a start from an engine's lifetime histograms: the prefills (or inter-token
// gaps) they must hold, and how far they may scale the defaults either way.
const (
	minLifetimeCount = 10
	maxLifetimeScale = 20.0
)

// startFromLifetime starts a pod the models have not learned from yet, whose engine served
// requests before Tandem first scraped it, from what the engine measured rather than from the
// defaults: the prefill model scaled so that the engine's mean prompt (its prompt-token
// counter over its prefill count) takes its mean prefill, the step model so that a step at
// its running requests takes its mean inter-token gap. Only the scale changes (the form of
// the defaults stays, one mean cannot tell a per-token cost from an attention term), and the
// first observations of Tandem's own requests correct it as they would the defaults.
func (q *pod) startFromLifetime(s *metrics.Sample) {
	scale := func(r *rls, f float64) {
		f = min(max(f, 1/maxLifetimeScale), maxLifetimeScale)
		for i := range r.theta {
			r.theta[i] *= f
		}
	}
	count := prefillCount(s)
	if mean, ok := prefillMean(s); ok && mean > 0 && !math.IsInf(mean, 0) && q.prefill.obs == 0 && s.HasPromptTokens && count >= minLifetimeCount {
		if tokens := s.PromptTokens / count; tokens >= 1 {
			scale(&q.prefill, mean/q.service(Prompt{Tokens: int(tokens)}))
			q.prefillScaled = true
		}
	}
	if q.step.obs == 0 && s.HasInterTokenMean && s.InterTokenCount >= minLifetimeCount && s.InterTokenMean > 0 && !math.IsInf(s.InterTokenMean, 0) {
		scale(&q.step, s.InterTokenMean/q.stepSeconds(max(q.engRunning, 1), q.engKV))
	}
}

// slotWait is how long a request arriving now waits for a running slot: with the engine's
// slots known and more requests on the pod than slots (Tandem's, or the engine's running and
// waiting), the k-th beyond them waits for k of the running requests to end, which, each
// decoding for the pod's mean and ending evenly, is k·mean/slots. Only a pod seen decoding
// (its mean measured on streams that ended there) holds slots that long: on a pod that only
// prefills, requests waiting behind one running prompt are the prefill queue the ledger has.
func (q *pod) slotWait() float64 {
	if q.slots.n <= 0 || q.streamSteps == 0 {
		return 0
	}
	on := max(float64(q.requests), q.engRunning+q.engWaiting)
	return max(on+1-q.slots.n, 0) * q.decodeSecs / q.slots.n
}

// unknownWaiting is how many of the requests the engine reported waiting at its last sample
// Tandem did not route there.
func (q *pod) unknownWaiting() float64 {
	return max(q.engWaiting-float64(max(q.ledger.charges, q.pending)), 0)
}

// prefillMean is the engine's mean prefill time over the interval: its prefill-time
// histogram's, or, for an engine that exports none (SGLang), its time to first token less
// its queue time over the same interval — what is left of the first token once the wait is
// taken out is the prefill (and the first token's step).
func prefillMean(s *metrics.Sample) (float64, bool) {
	if s.HasPrefillTimeMean {
		return s.PrefillTimeMean, s.PrefillCount > 0
	}
	if s.HasTTFTMean && s.HasQueueTimeMean && s.TTFTCount > 0 && s.QueueCount > 0 {
		mean := s.TTFTMean - s.QueueTimeMean
		return mean, mean > 0
	}
	return 0, false
}

// prefillCount is how many prefills prefillMean's mean is over.
func prefillCount(s *metrics.Sample) float64 {
	if !s.HasPrefillTimeMean {
		return s.TTFTCount // the engine's prefill is its TTFT less its queue time (prefillMean)
	}
	return s.PrefillCount
}
