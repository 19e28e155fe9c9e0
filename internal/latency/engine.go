package latency

import "github.com/tandem-epp/tandem/internal/metrics"

// The small accumulators a pod keeps over its engine's scraped samples. Each owns one view of
// the engine's metrics; pod.ingest (ingest.go) feeds them and fits the pod's models.

// engineSlots is how many requests the engine runs at once (max-num-seqs), learned from
// samples that report requests waiting while the same number run (n, 0: not known); run and
// seen count the samples in a row that agree.
type engineSlots struct {
	n, run float64
	seen   int
}

// slotSamples is how many samples in a row must report requests waiting while the same
// number run before that number is taken as the engine's slots.
const slotSamples = 3

// learn updates the engine's slot count from the latest sample's running and waiting
// requests: requests waiting while the same number run, sample after sample, is an engine at
// its limit of running requests (vLLM's max-num-seqs); more running than that limit says it
// was none (the wait was for something else, a prefill budget or KV blocks), and it is
// forgotten.
func (s *engineSlots) learn(running, waiting float64) {
	if s.n > 0 && running > s.n {
		s.n, s.run, s.seen = 0, 0, 0
	}
	if !(waiting > 0 && running > 0) {
		return
	}
	if running == s.run {
		s.seen++
	} else {
		s.run, s.seen = running, 1
	}
	if s.seen >= slotSamples {
		s.n = s.run
	}
}

// enginePrompts is the engine's mean prompt: its prompt-token counter at the last sample
// (seen: one was read), and the prompt tokens and prefills it reported in the intervals that
// saw prefills end, as decayed sums (a prompt counted in one interval may finish its prefill
// in the next: their ratio over a few intervals is the mean prompt).
type enginePrompts struct {
	tokens, ewPrompts, ewPrefills float64
	seen                          bool
}

// promptDecay weighs the previous intervals in the engine's mean prompt (ewPrompts): about ten
// intervals, enough to smooth prompts counted in one interval and prefilled in the next.
const promptDecay = 0.9

// took reads the sample's prompt-token counter: the prompt tokens the engine took in the
// interval, and whether that is known (a counter read before, and not reset since).
func (e *enginePrompts) took(s *metrics.Sample) (float64, bool) {
	prompts, havePrompts := 0.0, false
	if s.HasPromptTokens {
		if e.seen && s.PromptTokens >= e.tokens {
			prompts, havePrompts = s.PromptTokens-e.tokens, true
		}
		e.tokens, e.seen = s.PromptTokens, true
	}
	return prompts, havePrompts
}

// mean folds in an interval's prompt tokens and its count of prefills, and returns the mean
// prompt (tokens) over the recent intervals.
func (e *enginePrompts) mean(prompts, count float64) float64 {
	e.ewPrompts = promptDecay*e.ewPrompts + prompts
	e.ewPrefills = promptDecay*e.ewPrefills + count
	return e.ewPrompts / e.ewPrefills
}

// intervalEnds is the prefill features of the ends since the last sample, summed (x over n
// ends); observed: how many of them the prefill model was fitted on (observed or inferred).
// The engine's prefill-time histogram of that interval is fitted at their mean.
type intervalEnds struct {
	x        [3]float64
	n        float64
	observed int
}

// add notes the features of a prefill that ended since the last sample.
func (e *intervalEnds) add(p Prompt) {
	x := prefillX(p)
	for i := range x {
		e.x[i] += x[i]
	}
	e.n++
}

// mean is the mean features of the ends (n > 0).
func (e *intervalEnds) mean() [3]float64 {
	var x [3]float64
	for i := range x {
		x[i] = e.x[i] / e.n
	}
	return x
}

// unseenQueue is the engine's queue-time histogram against this replica's ledger: since the
// last sample, the engine requests of Tandem's that left the engine's queue (ownQueued: a
// prefill that ended, a decode leg's first byte) and the ledger's wait at each of Tandem's
// bookings, summed (knownSum over knownN); unseenWait is the mean wait beyond the ledger's
// that the engine reported over the last interval, when it scheduled requests Tandem did not
// route there (seconds; else 0).
type unseenQueue struct {
	ownQueued, knownSum, knownN float64
	unseenWait                  float64
}

// unseenMinRequests: an interval whose engine requests outnumber Tandem's (those that left
// the queue, and those that may be running) by fewer than this is taken as Tandem's alone.
const unseenMinRequests = 1

// booked notes the ledger's wait (backlog, seconds) at one of Tandem's bookings.
func (u *unseenQueue) booked(backlog float64) {
	u.knownSum += backlog
	u.knownN++
}

// seen compares the engine's queue-time histogram of the interval with what this replica's
// ledger knew. The engine's mean is over every request it scheduled in the interval, Tandem's
// and others', each having waited behind all the work ahead of it; the ledger knows Tandem's
// share of that work (its mean is taken at Tandem's bookings and at the sample: backlog).
// When the engine scheduled no more requests than Tandem's own that left its queue in the
// interval or may be running there (running), the ledger held everything they waited behind,
// and nothing is unseen: the histogram would only count the ledger's waits again. Otherwise
// the engine's mean less the ledger's is the wait for work others routed there. unknown is
// how many requests the engine reported waiting that Tandem did not route there.
func (u *unseenQueue) seen(s *metrics.Sample, backlog, unknown, running float64) {
	knownMean := (u.knownSum + backlog) / (u.knownN + 1)
	own := u.ownQueued
	u.ownQueued, u.knownSum, u.knownN = 0, 0, 0
	switch {
	case !s.HasQueueTimeMean:
		u.unseenWait = 0
	case !(s.QueueCount > 0):
		// Nothing left the queue: an idle pod (nothing unseen) or a stuck one (its waiting
		// requests say so; the last measure stands).
		if unknown == 0 {
			u.unseenWait = 0
		}
	case s.QueueCount-own-running < unseenMinRequests:
		// Tandem's prompts the engine runs may have been scheduled in the interval (the
		// engine counted them) without having ended yet (Tandem counts them when they do).
		u.unseenWait = 0
	default:
		u.unseenWait = max(s.QueueTimeMean-knownMean, 0)
	}
}
