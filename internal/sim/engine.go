package sim

import (
	"context"
	"sync"
)

// engine is one pod's scheduler in real time: the shared scheduling core (Batch: running
// batch, KV, FIFO admission, prefill chunks, prefix cache) behind a mutex, prefill lanes as a
// channel semaphore, and the gauges the metrics endpoint reads. Admitted requests still queued
// for a prefill lane count as waiting, not running, as in vLLM (a request is "running" once the
// scheduler gives it tokens to compute).
type engine struct {
	p Params
	// lanes admits PrefillLanes prefills at a time; channel senders are served in order.
	lanes chan struct{}

	mu       sync.Mutex
	b        *Batch
	laneWait int           // admitted requests queued for a prefill lane (reported as waiting)
	changed  chan struct{} // closed and replaced on every state change
	prefillQ int           // SGLang prefill legs waiting for their decode leg
	decodeQ  int           // decode legs waiting for their KV
	gen      int64         // output tokens generated
}

func newEngine(p Params) *engine {
	return &engine{p: p, b: NewBatch(p), changed: make(chan struct{}), lanes: make(chan struct{}, max(1, p.PrefillLanes))}
}

// Stats is a snapshot of a pod's scheduler.
type Stats struct {
	// Running is vLLM's num_requests_running: admitted sequences that are prefilling or decoding
	// (or holding a slot), not those still queued for a prefill lane.
	Running int
	// Waiting is vLLM's num_requests_waiting: requests queued for admission (a slot and KV)
	// plus admitted requests queued for a prefill lane.
	Waiting      int
	KVUsedTokens int // reserved KV tokens
	KVTokens     int // KV capacity
	CachedBlocks int // blocks in the prefix cache
	// PrefillBootstrap counts SGLang prefill legs waiting for their decode leg to connect.
	PrefillBootstrap int
	// DecodePrealloc counts decode legs waiting for their KV from a prefill pod.
	DecodePrealloc int
	// Generated counts output tokens since the pod started.
	Generated int64
}

func (e *engine) stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Stats{Running: e.b.Running() - e.laneWait, Waiting: e.b.Queued() + e.laneWait, KVUsedTokens: e.b.KVUsed(), KVTokens: e.p.KVTokens,
		CachedBlocks: e.b.CachedBlocks(), PrefillBootstrap: e.prefillQ, DecodePrealloc: e.decodeQ, Generated: e.gen}
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

// admission is one request's place in the running batch and its KV reservation.
type admission struct {
	e    *engine
	slot bool
	kv   int
	once sync.Once
}

// admit waits, in FIFO order, for a running slot and need tokens of KV (Batch.Enqueue).
func (e *engine) admit(ctx context.Context, need int) (*admission, error) {
	ready := make(chan struct{})
	e.mu.Lock()
	t := e.b.Enqueue(need, func() { close(ready) })
	e.notifyLocked()
	e.mu.Unlock()
	select {
	case <-ready:
		return &admission{e: e, slot: true, kv: need}, nil
	case <-ctx.Done():
		e.mu.Lock()
		defer e.mu.Unlock()
		e.b.Withdraw(t)
		e.notifyLocked()
		return nil, context.Cause(ctx)
	}
}

// prefillLane waits for a free prefill lane; release it with the returned function. While
// it waits, the request counts as waiting.
func (e *engine) prefillLane(ctx context.Context) (release func(), err error) {
	release = func() { <-e.lanes }
	select {
	case e.lanes <- struct{}{}:
		return release, nil
	default:
	}
	e.addLaneWait(1)
	defer e.addLaneWait(-1)
	select {
	case e.lanes <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func (e *engine) addLaneWait(d int) {
	e.mu.Lock()
	e.laneWait += d
	e.notifyLocked()
	e.mu.Unlock()
}

// beginChunk starts computing a prefill chunk of c model seconds and returns how long its
// iteration takes (Batch.BeginChunk).
func (e *engine) beginChunk(c float64) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.b.BeginChunk(c)
}

func (e *engine) endChunk(c float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.b.EndChunk(c)
}

// step is how long a decode step starting now takes (Batch.Step), with the admitted
// requests not queued for a prefill lane as the running batch.
func (e *engine) step() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.b.Step(e.b.Running() - e.laneWait)
}

// addDecoding moves the count of sequences generating tokens.
func (e *engine) addDecoding(d int) {
	e.mu.Lock()
	e.b.AddDecoding(d)
	e.mu.Unlock()
}

// leaveBatch frees the running slot but keeps the KV (a prefill leg's KV waiting to be pulled).
func (a *admission) leaveBatch() {
	a.e.mu.Lock()
	if a.slot {
		a.slot = false
		a.e.b.Leave(true, 0)
		a.e.notifyLocked()
	}
	a.e.mu.Unlock()
}

// keep frees the running slot and hands the KV to the caller, who frees it (once) with the
// returned function; release then does nothing. A prefill leg's KV outlives its request.
func (a *admission) keep() (free func()) {
	a.leaveBatch()
	a.once.Do(func() {})
	var once sync.Once
	return func() {
		once.Do(func() {
			a.e.mu.Lock()
			a.e.b.Leave(false, a.kv)
			a.e.notifyLocked()
			a.e.mu.Unlock()
		})
	}
}

// release frees the slot and the KV; safe to call more than once.
func (a *admission) release() {
	a.once.Do(func() {
		a.e.mu.Lock()
		a.e.b.Leave(a.slot, a.kv)
		a.slot = false
		a.e.notifyLocked()
		a.e.mu.Unlock()
	})
}

// lookup returns how many leading blocks of hashes the prefix cache holds, touching them.
func (e *engine) lookup(hashes []uint64) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.b.Lookup(hashes)
}

// remember puts computed blocks in the prefix cache (Batch.Remember).
func (e *engine) remember(hashes []uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.b.Remember(hashes)
	e.notifyLocked()
}
