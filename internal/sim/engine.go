package sim

import (
	"container/list"
	"context"
	"sync"
)

// engine is one pod's scheduler: a running batch of at most MaxRunning sequences, a FIFO
// waiting queue, KV capacity in tokens and a prefix cache of blocks with LRU eviction.
// Admitted requests still queued for a prefill lane count as waiting, not running, as in
// vLLM (a request is "running" once the scheduler gives it tokens to compute).
type engine struct {
	p Params
	// lanes admits PrefillLanes prefills at a time; channel senders are served in order.
	lanes chan struct{}

	mu       sync.Mutex
	running  int     // admitted: holds a slot, including laneWait
	laneWait int     // admitted requests queued for a prefill lane (reported as waiting)
	decoding int     // sequences generating tokens (their steps share an iteration with any prefill chunk)
	chunk    float64 // model seconds of the prefill chunks computing now (0: none)
	kvUsed   int     // tokens reserved by admitted requests and KV held for decode legs
	queue    list.List
	cache    prefixCache
	changed  chan struct{} // closed and replaced on every state change
	prefillQ int           // SGLang prefill legs waiting for their decode leg
	decodeQ  int           // decode legs waiting for their KV
	gen      int64         // output tokens generated
}

type waiter struct {
	need     int
	ready    chan struct{}
	admitted bool
}

func newEngine(p Params) *engine {
	e := &engine{p: p, changed: make(chan struct{}), lanes: make(chan struct{}, max(1, p.PrefillLanes))}
	e.cache.init()
	return e
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
	return Stats{Running: e.running - e.laneWait, Waiting: e.queue.Len() + e.laneWait, KVUsedTokens: e.kvUsed, KVTokens: e.p.KVTokens,
		CachedBlocks: e.cache.len(), PrefillBootstrap: e.prefillQ, DecodePrealloc: e.decodeQ, Generated: e.gen}
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

// admit waits, in FIFO order, for a running slot and need tokens of KV. Only the head of
// the queue may be admitted, as in vLLM's scheduler, so a large request is not starved.
func (e *engine) admit(ctx context.Context, need int) (*admission, error) {
	e.mu.Lock()
	w := &waiter{need: need, ready: make(chan struct{})}
	el := e.queue.PushBack(w)
	e.dispatchLocked()
	e.notifyLocked()
	e.mu.Unlock()
	select {
	case <-w.ready:
		return &admission{e: e, slot: true, kv: need}, nil
	case <-ctx.Done():
		e.mu.Lock()
		defer e.mu.Unlock()
		if w.admitted {
			e.running--
			e.kvUsed -= need
		} else {
			e.queue.Remove(el)
		}
		e.dispatchLocked()
		e.notifyLocked()
		return nil, context.Cause(ctx)
	}
}

func (e *engine) dispatchLocked() {
	for e.queue.Len() > 0 {
		w := e.queue.Front().Value.(*waiter)
		if e.running >= e.p.MaxRunning || e.kvUsed+w.need > e.p.KVTokens {
			return
		}
		e.queue.Remove(e.queue.Front())
		e.running++
		e.kvUsed += w.need
		w.admitted = true
		close(w.ready)
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
// iteration takes: StepSeconds with the decode step of the sequences decoding now.
func (e *engine) beginChunk(c float64) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.chunk += c
	return StepSeconds(e.p, e.decoding, c)
}

func (e *engine) endChunk(c float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.chunk -= c
	if e.chunk < 1e-12 {
		e.chunk = 0
	}
}

// step is how long a decode step starting now takes: InterTokenSeconds of the running batch,
// plus the prefill chunk computing on the pod, if any (it shares the iteration).
func (e *engine) step() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return StepSeconds(e.p, max(1, e.running-e.laneWait), e.chunk)
}

// addDecoding moves the count of sequences generating tokens.
func (e *engine) addDecoding(d int) {
	e.mu.Lock()
	e.decoding += d
	e.mu.Unlock()
}

// leaveBatch frees the running slot but keeps the KV (a prefill leg's KV waiting to be pulled).
func (a *admission) leaveBatch() {
	a.e.mu.Lock()
	if a.slot {
		a.slot = false
		a.e.running--
		a.e.dispatchLocked()
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
			a.e.kvUsed -= a.kv
			a.e.dispatchLocked()
			a.e.notifyLocked()
			a.e.mu.Unlock()
		})
	}
}

// release frees the slot and the KV; safe to call more than once.
func (a *admission) release() {
	a.once.Do(func() {
		a.e.mu.Lock()
		if a.slot {
			a.e.running--
		}
		a.slot = false
		a.e.kvUsed -= a.kv
		a.e.dispatchLocked()
		a.e.notifyLocked()
		a.e.mu.Unlock()
	})
}

// lookup returns how many leading blocks of hashes the prefix cache holds, touching them.
func (e *engine) lookup(hashes []uint64) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cache.match(hashes)
}

// remember puts computed blocks in the prefix cache, evicting the least recently used
// blocks beyond the KV that reservations leave free.
func (e *engine) remember(hashes []uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	limit := max(0, (e.p.KVTokens-e.kvUsed)/e.p.BlockSize)
	e.cache.insert(hashes, limit)
	e.notifyLocked()
}

// prefixCache is an LRU set of block hashes.
type prefixCache struct {
	order list.List // front = most recently used
	index map[uint64]*list.Element
}

func (c *prefixCache) init()    { c.index = map[uint64]*list.Element{} }
func (c *prefixCache) len() int { return len(c.index) }

func (c *prefixCache) match(hashes []uint64) int {
	n := 0
	for _, h := range hashes {
		el, ok := c.index[h]
		if !ok {
			break
		}
		c.order.MoveToFront(el)
		n++
	}
	return n
}

// insert touches the blocks back to front, so a prompt's first blocks (the ones other
// prompts share) are the last of them to be evicted.
func (c *prefixCache) insert(hashes []uint64, limit int) {
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if el, ok := c.index[h]; ok {
			c.order.MoveToFront(el)
			continue
		}
		c.index[h] = c.order.PushFront(h)
	}
	for len(c.index) > limit {
		el := c.order.Back()
		delete(c.index, el.Value.(uint64))
		c.order.Remove(el)
	}
}
