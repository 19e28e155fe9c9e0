package sim

import (
	"context"
	"sync"
	"time"
)

// engine is one pod's scheduler in real time: the shared scheduling core (Batch) behind a
// mutex, and a loop that runs its iterations — plan, sleep the iteration's model time at the
// pod's time scale, commit — and hands each event to the request it belongs to. Requests
// wait on their own handle, so the loop never blocks on a slow client.
type engine struct {
	p     Params
	scale float64
	start time.Time
	done  <-chan struct{}

	mu       sync.Mutex
	b        *Batch
	link     Link          // inbound KV transfers (model seconds since start)
	changed  chan struct{} // closed and replaced on every state change
	kick     chan struct{} // wakes the loop (capacity 1)
	running  bool          // the loop goroutine exists
	prefillQ int           // SGLang prefill legs waiting for their decode leg
	decodeQ  int           // decode legs waiting for their KV
	gen      int64         // output tokens generated
}

func newEngine(p Params, scale float64, done <-chan struct{}) *engine {
	return &engine{p: p, scale: scale, start: time.Now(), done: done, b: NewBatch(p),
		changed: make(chan struct{}), kick: make(chan struct{}, 1)}
}

// Stats is a snapshot of a pod's scheduler.
type Stats struct {
	// Running is vLLM's num_requests_running: sequences in the running batch (prefilling,
	// decoding, or hung).
	Running int
	// Waiting is vLLM's num_requests_waiting: sequences waiting to be scheduled (new,
	// preempted, or decode legs waiting for their KV).
	Waiting      int
	KVUsedTokens int // KV tokens held
	KVTokens     int // KV capacity
	CachedBlocks int // blocks in the prefix cache
	// PrefillBootstrap counts SGLang prefill legs waiting for their decode leg to connect.
	PrefillBootstrap int
	// DecodePrealloc counts decode legs waiting for their KV from a prefill pod.
	DecodePrealloc int
	// KVHeld counts finished prefill legs whose KV this pod holds until their decode leg pulls
	// it, an SGLang /abort_request names their rid, or kv_hold_seconds pass.
	KVHeld int
	// Generated counts output tokens since the pod started.
	Generated int64
	// Preemptions counts sequences that lost their KV because it ran out.
	Preemptions int
}

func (e *engine) stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Stats{Running: e.b.Running(), Waiting: e.b.Waiting(), KVUsedTokens: e.b.KVUsed(), KVTokens: e.p.KVTokens,
		CachedBlocks: e.b.CachedBlocks(), PrefillBootstrap: e.prefillQ, DecodePrealloc: e.decodeQ, KVHeld: e.b.Held(), Generated: e.gen,
		Preemptions: e.b.Preemptions}
}

// notifyLocked wakes whoever waits for a state change.
func (e *engine) notifyLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *engine) watch() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

// addQueue moves the bootstrap / prealloc gauges.
func (e *engine) addQueue(prefill, decode int) {
	e.mu.Lock()
	e.prefillQ += prefill
	e.decodeQ += decode
	e.notifyLocked()
	e.mu.Unlock()
}

// generated counts one output token.
func (e *engine) generated() {
	e.mu.Lock()
	e.gen++
	e.notifyLocked()
	e.mu.Unlock()
}

// seqHandle is a request's end of its sequence: the events the loop delivered, in order.
type seqHandle struct {
	e   *engine
	seq *Seq
	mu  sync.Mutex
	evs []EventKind
	sig chan struct{} // capacity 1: events arrived
}

func (h *seqHandle) push(k EventKind) {
	h.mu.Lock()
	h.evs = append(h.evs, k)
	h.mu.Unlock()
	select {
	case h.sig <- struct{}{}:
	default:
	}
}

// next waits for the sequence's next event; false if ctx ended first.
func (h *seqHandle) next(ctx context.Context) (EventKind, bool) {
	for {
		h.mu.Lock()
		if len(h.evs) > 0 {
			k := h.evs[0]
			h.evs = h.evs[1:]
			h.mu.Unlock()
			return k, true
		}
		h.mu.Unlock()
		select {
		case <-h.sig:
		case <-ctx.Done():
			return 0, false
		}
	}
}

// add queues a sequence and returns its handle.
func (e *engine) add(s *Seq) *seqHandle {
	h := &seqHandle{e: e, seq: s, sig: make(chan struct{}, 1)}
	s.Owner = h
	e.mu.Lock()
	e.b.Add(s)
	e.changedLocked()
	e.mu.Unlock()
	return h
}

// changedLocked notes a state change: watchers wake, and so does the loop (started on first use).
func (e *engine) changedLocked() {
	e.notifyLocked()
	if !e.running {
		e.running = true
		go e.loop()
	}
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// cancel takes the sequence out of the scheduler (a no-op once it finished).
func (h *seqHandle) cancel() {
	h.e.mu.Lock()
	h.e.b.Cancel(h.seq)
	h.e.changedLocked()
	h.e.mu.Unlock()
}

// release frees a held prefill leg's KV; safe to call more than once.
func (h *seqHandle) release() {
	h.e.mu.Lock()
	h.e.b.Release(h.seq)
	h.e.changedLocked()
	h.e.mu.Unlock()
}

// ready marks a decode leg's KV as arrived.
func (h *seqHandle) ready() {
	h.e.mu.Lock()
	h.e.b.Ready(h.seq)
	h.e.changedLocked()
	h.e.mu.Unlock()
}

// cached is how many prompt tokens the prefix cache supplied.
func (h *seqHandle) cached() int {
	h.e.mu.Lock()
	defer h.e.mu.Unlock()
	return h.seq.Cached()
}

// prefillSeconds is the model time from the sequence's first scheduling to its first token.
func (h *seqHandle) prefillSeconds() float64 {
	h.e.mu.Lock()
	defer h.e.mu.Unlock()
	return h.seq.PrefillSeconds()
}

// transfer waits for a KV transfer of tokens on the pod's inbound link (FIFO behind
// transfers already booked) and returns its model seconds, or false if ctx ended.
func (e *engine) transfer(ctx context.Context, tokens int) (float64, bool) {
	e.mu.Lock()
	now := time.Since(e.start).Seconds() / e.scale
	end := e.link.Reserve(now, TransferSeconds(e.p, tokens))
	e.mu.Unlock()
	if !sleepWall(ctx, Wall(end-now, e.scale)) {
		return 0, false
	}
	return end - now, true
}

func (e *engine) deliverLocked(evs []Event) {
	for _, ev := range evs {
		ev.Seq.Owner.(*seqHandle).push(ev.Kind)
	}
	if len(evs) > 0 {
		e.notifyLocked()
	}
}

// loop runs iterations while there is work and waits for a kick when there is none. It
// ends when the pod closes. Back-to-back iterations are timed from the previous one's
// deadline, not from when the loop got round to planning, so the loop's own overhead (locks,
// goroutine wake-ups, timer slack) does not add up over a busy run.
func (e *engine) loop() {
	var timer *time.Timer
	var deadline time.Time // when the previous iteration was due to end; zero after idling
	for {
		e.mu.Lock()
		evs, secs, ok := e.b.Plan()
		e.deliverLocked(evs)
		e.mu.Unlock()
		if !ok {
			deadline = time.Time{}
			select {
			case <-e.kick:
				continue
			case <-e.done:
				return
			}
		}
		now := time.Now()
		if deadline.IsZero() || deadline.Before(now.Add(-Wall(secs, e.scale))) {
			deadline = now // idle before, or so far behind that catching up would distort
		}
		deadline = deadline.Add(Wall(secs, e.scale))
		if d := time.Until(deadline); d > 0 {
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			select {
			case <-timer.C:
			case <-e.done:
				return
			}
		}
		e.mu.Lock()
		e.deliverLocked(e.b.Commit())
		e.mu.Unlock()
	}
}

// remember puts blocks in the prefix cache (a decode leg's pulled prompt).
func (e *engine) remember(hashes []uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.b.Remember(hashes)
	e.notifyLocked()
}
