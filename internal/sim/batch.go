package sim

import (
	"container/list"
	"slices"
)

// Batch is one pod's scheduling core, without a clock or a lock: vLLM's iteration-level
// scheduler in miniature. The real-time server drives it from a loop per pod that sleeps
// each iteration; the quality benchmark's virtual-time engine drives it from its event loop.
// Both therefore schedule by the same rules:
//   - a pod runs iterations. Plan builds the next one: first the running sequences in
//     admission order (one decode token each, or the next chunk of a prompt being prefilled),
//     then waiting sequences in FIFO order while the token budget (MaxBatchedTokens), the
//     running slots (MaxRunning), the prompts per iteration (PrefillLanes) and free KV allow;
//     a waiting sequence that does not fit blocks those behind it (head of line);
//   - the iteration lasts IterationSeconds of its work; Commit ends it: computed tokens are
//     in the KV, and a sequence whose tokens are all computed samples its next token (the
//     first one ends its prefill);
//   - KV is held in blocks for computed tokens and grows as tokens are produced; when a
//     running sequence needs a block and none is free, the most recently admitted running
//     sequence is preempted: its KV is dropped and it waits, first in line, to recompute its
//     prompt and output so far (vLLM's recompute preemption);
//   - a prefill leg (SeqPrefill) leaves the batch after its first token and holds its KV until
//     Release (its decode leg pulled it); a decode leg (SeqDecode) first gets KV blocks for the
//     whole prompt (EvAllocated: the caller pulls the KV, then calls Ready), then decodes;
//   - computed prompt blocks enter an LRU prefix cache bounded by the free KV, and a new
//     sequence starts from the longest cached prefix of its prompt.
//
// Callers serialise every call; Batch must not block, sleep or read the time.
type Batch struct {
	p        Params
	waiting  list.List // of *Seq, FIFO (preempted sequences go to the front)
	running  []*Seq    // admission order
	used     int       // KV blocks held by sequences
	total    int       // KV blocks
	cache    prefixCache
	inflight []*Seq // scheduled in the iteration Plan started
	planned  bool
	last     float64 // model seconds of the iteration in flight
	// prefilling are sequences between their first scheduling and their first token (they
	// accrue every iteration's time, scheduled in it or not)
	prefilling map[*Seq]struct{}

	// Cost, if set, is an iteration's length instead of IterationSeconds(p, work): work[i] is
	// seqs[i]'s share (an engine scenario, Perturbation.Cost).
	Cost func(work []Work, seqs []*Seq) float64

	// Counters for reports.
	Iterations, Mixed, Preemptions int // iterations; of which carried prefill and decode work; preemptions
	BusySeconds                    float64

	held int // finished prefill legs whose KV is held for their decode leg
}

// SeqKind says what a sequence computes.
type SeqKind int

const (
	SeqWhole   SeqKind = iota // prefill then decode on this pod
	SeqPrefill                // a PD prefill leg: prefill, one token, then hold the KV for the decode leg
	SeqDecode                 // a PD decode leg: the prompt's KV arrives from a prefill pod, then decode
)

// Seq is one request in a pod's scheduler. Set the exported fields, then Add it.
type Seq struct {
	Kind   SeqKind
	Prompt int      // prompt tokens (≥ 1)
	Out    int      // tokens to generate (≥ 1; a prefill leg generates 1)
	Hashes []uint64 // block hashes of the prompt, for the prefix cache
	// PauseAfter, if > 0, stops scheduling the sequence once it has generated that many
	// tokens: it keeps its running slot and KV, as a hung request does (fault injection).
	PauseAfter int
	// Owner is the caller's: events carry the Seq, Owner finds the request.
	Owner any

	state     seqState
	el        *list.Element
	tokens    int // prompt + generated: what the next sample needs in the KV
	computed  int // tokens whose KV is computed (or arrived)
	generated int
	blocks    int
	cached    int     // prompt tokens the prefix cache gave at the first scheduling
	scheduled bool    // scheduled at least once
	allocated bool    // decode leg: KV blocks for the prompt are held
	ready     bool    // decode leg: the KV arrived
	local     bool    // computes its own prompt (not a decode leg waiting for remote KV)
	remember  bool    // prompt blocks not yet in the prefix cache
	prefillS  float64 // model seconds from the first scheduling to the first token
	n         int     // tokens scheduled in the iteration in flight
	chunked   bool    // a prompt chunk of it has been scheduled (PrefillBase is paid)
}

type seqState int

const (
	stateNew seqState = iota
	stateWaiting
	stateRunning
	stateHeld // a finished prefill leg's KV, until Release
	stateDone
)

// Generated is how many tokens the sequence has sampled.
func (s *Seq) Generated() int { return s.generated }

// PrefillSeconds is the model time of the iterations from the sequence's first scheduling to
// its first token (its prefill, with whatever shared those iterations).
func (s *Seq) PrefillSeconds() float64 { return s.prefillS }

// Cached is how many prompt tokens the prefix cache supplied when it was first scheduled.
func (s *Seq) Cached() int { return s.cached }

// EventKind is what happened to a sequence.
type EventKind int

const (
	// EvScheduled: first scheduled (its queueing ends); Seq.Cached is known.
	EvScheduled EventKind = iota
	// EvAllocated: a decode leg holds KV blocks for its prompt: pull the KV, then call Ready.
	EvAllocated
	// EvToken: a token was sampled; Seq.Generated is its 1-based index. The first ends the prefill.
	EvToken
	// EvHeld: a prefill leg finished; its KV is held until Release.
	EvHeld
	// EvFinished: the sequence generated Out tokens and left; its KV is free.
	EvFinished
	// EvPreempted: KV ran out; the sequence lost its KV and waits to recompute it.
	EvPreempted
)

// Event is one thing that happened to a sequence during Plan or Commit.
type Event struct {
	Kind EventKind
	Seq  *Seq
}

// NewBatch returns an empty scheduler for a pod with parameters p.
func NewBatch(p Params) *Batch {
	b := &Batch{p: p, total: max(1, p.KVTokens/max(1, p.BlockSize)), prefilling: map[*Seq]struct{}{}}
	b.cache.init()
	return b
}

func (b *Batch) blocksFor(tokens int) int { return (tokens + b.p.BlockSize - 1) / b.p.BlockSize }
func (b *Batch) free() int                { return b.total - b.used }

// Add queues a sequence.
func (b *Batch) Add(s *Seq) {
	s.tokens = s.Prompt
	s.local = s.Kind != SeqDecode
	s.remember = s.local
	s.state = stateWaiting
	s.el = b.waiting.PushBack(s)
}

// Ready marks a decode leg's KV as arrived: it is scheduled from the next iteration on.
func (b *Batch) Ready(s *Seq) { s.ready = true }

// Release frees a held prefill leg's KV (its decode leg pulled it, or gave up).
func (b *Batch) Release(s *Seq) {
	if s.state == stateHeld {
		b.drop(s)
		s.state = stateDone
		b.held--
	}
}

// Cancel takes a sequence out wherever it is (waiting, running, held), freeing its KV. A
// sequence in the iteration in flight is dropped from it.
func (b *Batch) Cancel(s *Seq) {
	switch s.state {
	case stateWaiting:
		b.waiting.Remove(s.el)
	case stateRunning:
		b.running = slices.DeleteFunc(b.running, func(x *Seq) bool { return x == s })
	case stateNew, stateDone, stateHeld:
		return // a held prefill leg's KV belongs to its hold (Release)
	}
	b.drop(s)
	delete(b.prefilling, s)
	s.state = stateDone
}

// drop frees a sequence's KV, keeping its prompt blocks in the prefix cache.
func (b *Batch) drop(s *Seq) {
	b.used -= s.blocks
	s.blocks = 0
	if s.local && s.computed >= s.Prompt {
		b.cache.insert(s.Hashes, b.free())
	}
}

// Plan starts the next iteration: it schedules work as the type's doc says and returns the
// events that happened while scheduling (admissions, preemptions), the iteration's length in
// model seconds, and whether there is an iteration (false: nothing to run until something
// changes). Call Commit when the iteration ends, before planning again.
func (b *Batch) Plan() (events []Event, seconds float64, ok bool) {
	if b.planned {
		panic("sim: Batch.Plan called twice without Commit")
	}
	budget := b.p.MaxBatchedTokens
	if budget <= 0 {
		budget = int(^uint(0) >> 1)
	}
	lanes := b.p.PrefillLanes
	if lanes <= 0 {
		lanes = int(^uint(0) >> 1)
	}
	var work []Work
	var sched []*Seq
	prefills, decodes := 0, 0
	take := func(s *Seq, n int) {
		s.n = n
		prompt := n > 1 || (s.local && s.generated == 0)
		work = append(work, Work{Done: s.computed, N: n, First: prompt && !s.chunked})
		sched = append(sched, s)
		budget -= n
		if prompt {
			s.chunked = true
			prefills++
		} else {
			decodes++
		}
	}
	preempted := false
	for i := 0; i < len(b.running) && budget > 0; i++ {
		s := b.running[i]
		if s.PauseAfter > 0 && s.generated >= s.PauseAfter {
			continue
		}
		n := min(s.tokens-s.computed, budget)
		if (n > 1 || (s.local && s.generated == 0)) && prefills >= lanes {
			continue
		}
		need := b.blocksFor(s.computed+n) - s.blocks
		for need > b.free() {
			victim := b.running[len(b.running)-1]
			events = append(events, b.preempt(victim))
			preempted = true
			if victim == s {
				break
			}
		}
		if s.state != stateRunning {
			break // s itself was preempted: it was the last one
		}
		s.blocks += need
		b.used += need
		take(s, n)
	}
	// Admit waiting sequences, FIFO, unless this iteration had to preempt (as vLLM).
	for e := b.waiting.Front(); e != nil && !preempted && budget > 0; {
		s := e.Value.(*Seq)
		next := e.Next()
		if !s.local {
			if !s.allocated {
				need := b.blocksFor(s.Prompt)
				if need > b.free() || len(b.running) >= b.p.MaxRunning {
					break
				}
				s.blocks, s.allocated = need, true
				b.used += need
				events = append(events, Event{EvAllocated, s})
			}
			if !s.ready {
				e = next
				continue // waiting for its KV; those behind it may go first (vLLM skips it)
			}
			s.computed = s.Prompt - 1 // the KV arrived; the last prompt token computes here
		}
		if len(b.running) >= b.p.MaxRunning {
			break
		}
		if s.local && !s.scheduled {
			s.cached = CachedTokens(b.p, s.tokens, b.cache.match(s.Hashes))
			s.computed = s.cached
		} else if s.local && s.computed == 0 {
			// Recomputing after preemption: the prefix cache may still hold its prompt.
			s.computed = CachedTokens(b.p, s.tokens, b.cache.match(s.Hashes))
		}
		n := min(s.tokens-s.computed, budget)
		if (n > 1 || (s.local && s.generated == 0)) && prefills >= lanes {
			break
		}
		need := b.blocksFor(s.computed+n) - s.blocks
		if need > b.free() {
			if !s.scheduled && s.local {
				s.computed = 0 // not admitted: look the cache up again next time
			}
			break
		}
		s.blocks += need
		b.used += need
		b.waiting.Remove(e)
		s.el = nil
		s.state = stateRunning
		b.running = append(b.running, s)
		if !s.scheduled {
			s.scheduled = true
			b.prefilling[s] = struct{}{}
			events = append(events, Event{EvScheduled, s})
		}
		take(s, n)
		e = next
	}
	if len(sched) == 0 {
		return events, 0, false
	}
	b.planned, b.inflight = true, sched
	if b.Cost != nil {
		seconds = b.Cost(work, sched)
	} else {
		seconds = IterationSeconds(b.p, work)
	}
	b.last = seconds
	b.Iterations++
	b.BusySeconds += seconds
	if prefills > 0 && decodes > 0 {
		b.Mixed++
	}
	return events, seconds, true
}

// preempt drops a running sequence's KV and puts it first in line to recompute.
func (b *Batch) preempt(s *Seq) Event {
	b.running = slices.DeleteFunc(b.running, func(x *Seq) bool { return x == s })
	b.drop(s)
	s.computed, s.n = 0, 0
	s.local, s.allocated, s.chunked = true, false, false
	s.state = stateWaiting
	s.el = b.waiting.PushFront(s)
	b.Preemptions++
	return Event{EvPreempted, s}
}

// Commit ends the iteration Plan started and returns what happened: tokens sampled,
// prefill legs done (EvHeld), sequences finished.
func (b *Batch) Commit() []Event {
	if !b.planned {
		return nil
	}
	var events []Event
	for s := range b.prefilling {
		s.prefillS += b.last
	}
	for _, s := range b.inflight {
		n := s.n
		s.n = 0
		if s.state != stateRunning || n == 0 {
			continue // cancelled or preempted meanwhile
		}
		s.computed += n
		if s.computed < s.tokens {
			continue // a prompt chunk; more to come
		}
		if s.remember && s.computed >= s.Prompt {
			b.cache.insert(s.Hashes, b.free())
			s.remember = false
		}
		s.generated++
		s.tokens++
		delete(b.prefilling, s)
		events = append(events, Event{EvToken, s})
		switch {
		case s.PauseAfter > 0 && s.generated >= s.PauseAfter:
			// hung: keeps its slot and KV, scheduled no more
		case s.Kind == SeqPrefill:
			b.running = slices.DeleteFunc(b.running, func(x *Seq) bool { return x == s })
			s.state = stateHeld
			b.held++
			events = append(events, Event{EvHeld, s})
		case s.generated >= s.Out:
			b.running = slices.DeleteFunc(b.running, func(x *Seq) bool { return x == s })
			b.drop(s)
			s.state = stateDone
			events = append(events, Event{EvFinished, s})
		}
	}
	b.inflight, b.planned = nil, false
	return events
}

// Held is how many finished prefill legs hold their KV for a decode leg (until Release).
func (b *Batch) Held() int { return b.held }

// Running is vLLM's num_requests_running: sequences in the running batch (prefilling,
// decoding, or hung).
func (b *Batch) Running() int { return len(b.running) }

// Waiting is vLLM's num_requests_waiting: sequences not yet (or, preempted, no longer)
// running, including decode legs waiting for their KV.
func (b *Batch) Waiting() int { return b.waiting.Len() }

// KVUsed is the KV tokens held (in whole blocks) by running, waiting and held sequences.
func (b *Batch) KVUsed() int { return b.used * b.p.BlockSize }

// Lookup returns how many leading blocks of hashes the prefix cache holds, touching them.
func (b *Batch) Lookup(hashes []uint64) int { return b.cache.match(hashes) }

// Remember puts blocks in the prefix cache, evicting the least recently used beyond the free KV.
func (b *Batch) Remember(hashes []uint64) { b.cache.insert(hashes, b.free()) }

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
	for len(c.index) > max(0, limit) {
		el := c.order.Back()
		delete(c.index, el.Value.(uint64))
		c.order.Remove(el)
	}
}
