package main

import (
	"container/heap"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/sim"
)

// The virtual-time engine. Every pod is internal/sim's scheduling core (sim.Batch) — the
// one its real-time server runs — driven by this event loop: Plan starts an iteration, an
// event IterationSeconds later commits it, and the events it returns (tokens, finished legs,
// preemptions) move the requests on. So admission, the token budget, batched and chunked
// prefills, KV growth and preemption, the prefix cache and the cost of each iteration are
// exactly the simulator's. A PD pair: the prefill leg runs on its pod and holds its KV; the
// decode leg gets KV blocks on its pod (until then the prefill KV stays held: backpressure),
// which releases the prefill KV and books the transfer on the decode pod's inbound link (FIFO,
// TransferSeconds each), then decodes; its first token costs one decode step.

// des is the discrete-event loop: events run in (time, insertion) order, and the injected
// clock is set to each event's time before it runs, so the picker reads virtual time.
type des struct {
	now   float64 // seconds since base
	seq   uint64
	q     eventHeap
	base  time.Time
	clock *load.ManualClock
}

type event struct {
	t   float64
	seq uint64
	fn  func()
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// simBase is the virtual epoch: fixed, so runs are reproducible.
var simBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newDES() *des {
	return &des{base: simBase, clock: load.NewManualClock(simBase)}
}

// at schedules fn at time t (never in the past).
func (d *des) at(t float64, fn func()) {
	if t < d.now {
		t = d.now
	}
	d.seq++
	heap.Push(&d.q, event{t: t, seq: d.seq, fn: fn})
}

// after schedules fn dt seconds from now.
func (d *des) after(dt float64, fn func()) { d.at(d.now+dt, fn) }

func (d *des) run() {
	for d.q.Len() > 0 {
		e := heap.Pop(&d.q).(event)
		d.now = e.t
		d.clock.Set(d.base.Add(time.Duration(e.t * float64(time.Second))))
		e.fn()
	}
}

// vpod is one simulated engine pod: internal/sim's scheduling core driven by the event
// loop, its inbound KV link, and the counters a scrape and the report read.
type vpod struct {
	d     *des
	ep    *pool.Endpoint
	p     sim.Params
	b     *sim.Batch
	class string // "prefill", "decode" or "standard"
	link  sim.Link
	busy  bool // an iteration is in flight
	// the engine scenario of this pod (nil: the calibrated profile), and the stalls it
	// caused (for the report: which pod, from when to when)
	perturb *sim.Perturbation
	stalls  *[]stallEvent

	gen      int64
	prefillS float64 // sum of the prefill-time histogram (model seconds)
	prefillN int
	// the queue-time (added → first scheduled) and time-to-first-token (added → first
	// token) histograms, as vLLM's request_queue_time_seconds and time_to_first_token_seconds
	queue, ttft histTotals

	lastGen   int64
	lastGenAt float64
	scraped   int
	// the prefill-time histogram's totals at the previous scrape
	lastPrefillS float64
	lastPrefillN int
	lastMean     float64
}

// histTotals is one histogram's sum and count, and their values at the previous scrape.
type histTotals struct {
	sum, lastSum, lastMean float64
	n, lastN               int
}

func (h *histTotals) observe(v float64) { h.sum += v; h.n++ }

// interval is what the scraper derives from the histogram: the mean over the observations
// since the previous scrape and their number, else the last such mean with count 0.
func (h *histTotals) interval() (mean, count float64, ok bool) {
	if n := h.n - h.lastN; n > 0 {
		h.lastMean = (h.sum - h.lastSum) / float64(n)
		count = float64(n)
	}
	h.lastSum, h.lastN = h.sum, h.n
	return h.lastMean, count, h.n > 0
}

// stallEvent is one stalled iteration of a pod, in virtual seconds.
type stallEvent struct {
	pod      string
	from, to float64
}

// handler is a sequence's Owner in the virtual engine: what to do on each of its events.
type handler func(sim.Event)

func newPod(d *des, ep *pool.Endpoint, p sim.Params) *vpod {
	class := "standard"
	switch ep.Role {
	case pool.RolePrefill:
		class = "prefill"
	case pool.RoleDecode:
		class = "decode"
	}
	return &vpod{d: d, ep: ep, p: p, b: sim.NewBatch(p), class: class}
}

// add queues a sequence whose events go to h.
func (v *vpod) add(s *sim.Seq, h handler) {
	added, scheduled, first := v.d.now, false, false
	s.Owner = handler(func(e sim.Event) {
		switch {
		case e.Kind == sim.EvScheduled && !scheduled:
			scheduled = true
			v.queue.observe(v.d.now - added)
		case e.Kind == sim.EvToken && !first:
			first = true
			v.ttft.observe(v.d.now - added)
		}
		h(e)
	})
	v.b.Add(s)
	v.kick()
}

// kick starts an iteration if none is in flight and there is work.
func (v *vpod) kick() {
	if v.busy {
		return
	}
	evs, secs, ok := v.b.Plan()
	if ok {
		v.busy = true
		if v.perturb != nil && v.perturb.Stalled && v.stalls != nil {
			*v.stalls = append(*v.stalls, stallEvent{pod: v.ep.Key(), from: v.d.now, to: v.d.now + secs})
		}
		v.d.after(secs, v.commit)
	}
	dispatch(evs)
}

func (v *vpod) commit() {
	evs := v.b.Commit()
	v.busy = false
	dispatch(evs)
	v.kick()
}

func dispatch(evs []sim.Event) {
	for _, e := range evs {
		e.Seq.Owner.(handler)(e)
	}
}

// sample is what a vLLM scrape of this pod would publish now, as the production scraper
// turns it into a sample: the gauges, the generation throughput derived from the token
// counter between two scrapes, the means of the prefill-time, queue-time and TTFT histograms
// over the requests that reached them since the previous scrape (the last such mean when
// none did).
func (v *vpod) sample() *metrics.Sample {
	s := &metrics.Sample{
		Running: float64(v.b.Running()), HasRunning: true,
		Waiting: float64(v.b.Waiting()), HasWaiting: true,
		KVUsage: float64(v.b.KVUsed()) / float64(v.p.KVTokens), HasKVUsage: true,
		BlockSize: v.p.BlockSize, NumGPUBlocks: v.p.KVTokens / v.p.BlockSize,
		UpdatedAt: v.d.clock.Now(),
	}
	if v.scraped > 0 && v.d.now > v.lastGenAt {
		s.GenThroughput = float64(v.gen-v.lastGen) / (v.d.now - v.lastGenAt)
		s.HasGenThroughput = true
	}
	if n := v.prefillN - v.lastPrefillN; n > 0 {
		v.lastMean = (v.prefillS - v.lastPrefillS) / float64(n)
		s.PrefillCount = float64(n)
	}
	if v.prefillN > 0 {
		s.PrefillTimeMean, s.HasPrefillTimeMean = v.lastMean, true
	}
	v.lastPrefillS, v.lastPrefillN = v.prefillS, v.prefillN
	s.QueueTimeMean, s.QueueCount, s.HasQueueTimeMean = v.queue.interval()
	s.TTFTMean, s.TTFTCount, s.HasTTFTMean = v.ttft.interval()
	v.lastGen, v.lastGenAt = v.gen, v.d.now
	v.scraped++
	return s
}
