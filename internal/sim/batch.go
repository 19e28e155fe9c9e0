package sim

import "container/list"

// Batch is one pod's scheduling core, without a clock or a lock: the running batch, the KV
// reservations, the FIFO admission queue, the prefill chunk computing now and the prefix
// cache. The real-time server drives it under its engine's mutex; the quality benchmark's
// virtual-time engine drives it from its event loop. Both therefore admit, step and cache
// by the same rules:
//   - a request reserves a running slot and its KV tokens, FIFO, head of the queue only (as
//     in vLLM's scheduler, so a large request is not starved by small ones behind it);
//   - an iteration carrying a prefill chunk also carries the decode step of the sequences
//     decoding now, and a decode step that starts while a chunk computes waits for it;
//   - computed blocks enter an LRU prefix cache bounded by the KV that reservations leave free.
//
// Callers serialise every call; Batch must not block, sleep or read the time.
type Batch struct {
	p        Params
	running  int       // admitted requests holding a running slot
	kvUsed   int       // tokens reserved by admitted requests and KV kept for decode legs
	queue    list.List // of *Ticket, waiting for admission
	decoding int       // sequences generating tokens
	chunk    float64   // model seconds of the prefill chunks computing now (0: none)
	cache    prefixCache
}

// Ticket is one request's place in the admission queue.
type Ticket struct {
	need     int
	admitted bool
	onAdmit  func()
	el       *list.Element
}

// NewBatch returns an empty batch for a pod with parameters p.
func NewBatch(p Params) *Batch {
	b := &Batch{p: p}
	b.cache.init()
	return b
}

// Enqueue queues a request needing need KV tokens. onAdmit runs, inside this call or a later
// one that frees room, once the request holds a slot and its KV.
func (b *Batch) Enqueue(need int, onAdmit func()) *Ticket {
	t := &Ticket{need: need, onAdmit: onAdmit}
	t.el = b.queue.PushBack(t)
	b.dispatch()
	return t
}

// Withdraw takes back a ticket whose request gave up: out of the queue, or, if it was
// admitted meanwhile, its slot and KV freed.
func (b *Batch) Withdraw(t *Ticket) {
	if t.admitted {
		b.running--
		b.kvUsed -= t.need
	} else {
		b.queue.Remove(t.el)
	}
	b.dispatch()
}

// Leave frees a running slot (if slot) and kv tokens of KV, admitting whoever now fits.
func (b *Batch) Leave(slot bool, kv int) {
	if slot {
		b.running--
	}
	b.kvUsed -= kv
	b.dispatch()
}

func (b *Batch) dispatch() {
	for b.queue.Len() > 0 {
		t := b.queue.Front().Value.(*Ticket)
		if b.running >= b.p.MaxRunning || b.kvUsed+t.need > b.p.KVTokens {
			return
		}
		b.queue.Remove(b.queue.Front())
		b.running++
		b.kvUsed += t.need
		t.admitted = true
		t.onAdmit()
	}
}

// Running is how many admitted requests hold a running slot (including any still queued
// for a prefill lane; vLLM's running count subtracts those).
func (b *Batch) Running() int { return b.running }

// Queued is how many requests wait for admission.
func (b *Batch) Queued() int { return b.queue.Len() }

// KVUsed is the KV tokens reserved.
func (b *Batch) KVUsed() int { return b.kvUsed }

// AddDecoding moves the count of sequences generating tokens.
func (b *Batch) AddDecoding(d int) { b.decoding += d }

// BeginChunk starts computing a prefill chunk of c model seconds and returns how long its
// iteration takes: StepSeconds with the decode step of the sequences decoding now.
func (b *Batch) BeginChunk(c float64) float64 {
	b.chunk += c
	return StepSeconds(b.p, b.decoding, c)
}

// EndChunk ends a chunk BeginChunk started.
func (b *Batch) EndChunk(c float64) {
	b.chunk -= c
	if b.chunk < 1e-12 {
		b.chunk = 0
	}
}

// Stalling reports whether a prefill chunk is computing, so a decode step starting now waits
// for it.
func (b *Batch) Stalling() bool { return b.chunk > 0 }

// Step is how long a decode step starting now takes with active sequences in the running
// batch (at least one): their inter-token step plus the prefill chunk computing, if any.
func (b *Batch) Step(active int) float64 {
	return StepSeconds(b.p, max(1, active), b.chunk)
}

// Lookup returns how many leading blocks of hashes the prefix cache holds, touching them.
func (b *Batch) Lookup(hashes []uint64) int { return b.cache.match(hashes) }

// Remember puts computed blocks in the prefix cache, evicting the least recently used
// blocks beyond the KV that reservations leave free.
func (b *Batch) Remember(hashes []uint64) {
	b.cache.insert(hashes, max(0, (b.p.KVTokens-b.kvUsed)/b.p.BlockSize))
}

// CachedBlocks is how many blocks the prefix cache holds.
func (b *Batch) CachedBlocks() int { return b.cache.len() }

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
