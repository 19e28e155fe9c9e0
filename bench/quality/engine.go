package main

import (
	"container/heap"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/sim"
)

// The virtual-time engine. Every latency comes from internal/sim's model functions
// (PrefillChunk, PrefillChunkSeconds, StepSeconds, InterTokenSeconds, TransferSeconds,
// CachedTokens, BlockHashes), and admission, chunk stepping and the prefix cache are
// internal/sim's own scheduling core (sim.Batch), the one its real-time server runs:
//   - a request reserves prompt+output KV tokens and a running slot, FIFO, head of queue only;
//   - a plain or prefill leg then queues FIFO for one of PrefillLanes prefill lanes (counted as
//     waiting, as vLLM does) and computes its uncached tokens in chunks of PrefillChunkTokens;
//     each chunk's iteration takes StepSeconds(sequences decoding on the pod, chunk cost); its
//     first token is out at the end of the last chunk;
//   - every further token takes StepSeconds(running batch, prefill chunk computing on the pod
//     when the step starts): decodes on a combined pod stall behind prefills;
//   - a decode leg pulls the KV (freeing it on the prefill pod), takes a slot, pays
//     TransferSeconds(prompt tokens) and then one inter-token step per token, the first too;
//   - computed blocks enter an LRU prefix cache bounded by the KV that reservations leave free.

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

// vpod is one simulated engine pod: internal/sim's scheduling core (sim.Batch) driven by
// the event loop, prefill lanes as a counter and a FIFO of continuations, and the counters a
// scrape and the report read.
type vpod struct {
	d  *des
	ep *pool.Endpoint
	p  sim.Params
	b  *sim.Batch

	lanes    int // prefill lanes in use
	laneQ    []func()
	steps    int // decode steps taken
	stalled  int // of which rode a prefill chunk's iteration
	gen      int64
	prefillS float64
	prefillN int

	lastGen   int64
	lastGenAt float64
	scraped   int
}

func newPod(d *des, ep *pool.Endpoint, p sim.Params) *vpod {
	return &vpod{d: d, ep: ep, p: p, b: sim.NewBatch(p)}
}

// admit queues for a running slot and need KV tokens; fn runs once admitted.
func (v *vpod) admit(need int, fn func()) {
	v.b.Enqueue(need, func() { v.d.at(v.d.now, fn) })
}

// leave frees a running slot and kv tokens of KV.
func (v *vpod) leave(slot bool, kv int) { v.b.Leave(slot, kv) }

// lane waits for a prefill lane; the caller releases it with releaseLane.
func (v *vpod) lane(fn func()) {
	if v.lanes < max(1, v.p.PrefillLanes) {
		v.lanes++
		v.d.at(v.d.now, fn)
		return
	}
	v.laneQ = append(v.laneQ, fn)
}

// active is vLLM's running count: admitted sequences not queued for a prefill lane.
func (v *vpod) active() int { return v.b.Running() - len(v.laneQ) }

func (v *vpod) releaseLane() {
	if len(v.laneQ) > 0 {
		fn := v.laneQ[0]
		v.laneQ[0] = nil
		v.laneQ = v.laneQ[1:]
		v.d.at(v.d.now, fn)
		return
	}
	v.lanes--
}

// itl is how long a decode step starting now takes (sim.Batch.Step). It counts the steps
// and the stalled ones.
func (v *vpod) itl() float64 {
	v.steps++
	if v.b.Stalling() {
		v.stalled++
	}
	return v.b.Step(v.active())
}

// prefill computes uncached prompt tokens chunk by chunk, each iteration also carrying the
// decode step of the sequences decoding on the pod (sim.Batch.BeginChunk), then calls done
// with the model seconds it took (PrefillSeconds(uncached) on an idle pod). The caller holds
// a prefill lane.
func (v *vpod) prefill(uncached int, done func(total float64)) {
	total := 0.0
	var chunk func(at int)
	chunk = func(at int) {
		if at >= uncached {
			done(total)
			return
		}
		n := sim.PrefillChunk(v.p, uncached-at)
		c := sim.PrefillChunkSeconds(v.p, at, n)
		step := v.b.BeginChunk(c)
		total += step
		v.d.after(step, func() {
			v.b.EndChunk(c)
			chunk(at + n)
		})
	}
	chunk(0)
}

// sample is what a vLLM scrape of this pod would publish now: the gauges, the generation
// throughput derived from the token counter between two scrapes, the mean of the
// prefill-time histogram.
func (v *vpod) sample() *metrics.Sample {
	s := &metrics.Sample{
		Running: float64(v.active()), HasRunning: true,
		Waiting: float64(v.b.Queued() + len(v.laneQ)), HasWaiting: true,
		KVUsage: float64(v.b.KVUsed()) / float64(v.p.KVTokens), HasKVUsage: true,
		BlockSize: v.p.BlockSize, NumGPUBlocks: v.p.KVTokens / v.p.BlockSize,
		UpdatedAt: v.d.clock.Now(),
	}
	if v.scraped > 0 && v.d.now > v.lastGenAt {
		s.GenThroughput = float64(v.gen-v.lastGen) / (v.d.now - v.lastGenAt)
		s.HasGenThroughput = true
	}
	if v.prefillN > 0 {
		s.PrefillTimeMean = v.prefillS / float64(v.prefillN)
		s.HasPrefillTimeMean = true
	}
	v.lastGen, v.lastGenAt = v.gen, v.d.now
	v.scraped++
	return s
}
