package sim

import (
	"slices"
	"testing"
)

// unitParams is a model a reader can check by hand: compute 0.001 s per token, no attention
// term, memory 0.010 s per iteration plus 0.0001 s per token of KV attended to, budget 100
// tokens, 16-token blocks.
func unitParams() Params {
	return Params{PrefillPerToken: 0.001, DecodeBase: 0.010, DecodePerKVToken: 0.0001,
		MaxRunning: 8, MaxBatchedTokens: 100, KVTokens: 1600, BlockSize: 16, DefaultMaxTokens: 16}
}

// step runs one iteration and returns its length and the kinds of events of each sequence.
func step(t *testing.T, b *Batch) (float64, map[*Seq][]EventKind) {
	t.Helper()
	got := map[*Seq][]EventKind{}
	evs, secs, ok := b.Plan()
	for _, e := range evs {
		got[e.Seq] = append(got[e.Seq], e.Kind)
	}
	if !ok {
		return 0, got
	}
	for _, e := range b.Commit() {
		got[e.Seq] = append(got[e.Seq], e.Kind)
	}
	return secs, got
}

// A prompt is prefilled in chunks of the token budget; decodes go first in each iteration and
// a chunk fills what they leave. Numbers: A (30-token prompt, 3 out) alone, then B (250
// tokens, 1 out) joins. Iteration 1: A's prompt, compute 0.030 > memory 0.010. Then A decodes
// (1 token, 30 tokens of KV: memory 0.013) beside B's chunks of 99, 99 and 52 tokens.
func TestBatchChunksAndPiggybacks(t *testing.T) {
	b := NewBatch(unitParams())
	a := &Seq{Prompt: 30, Out: 3}
	b.Add(a)
	secs, ev := step(t, b)
	if !near(secs, 0.030) || !slices.Equal(ev[a], []EventKind{EvScheduled, EvToken}) {
		t.Fatalf("A's prefill: %v s, events %v; want 0.030 and [scheduled token]", secs, ev[a])
	}
	bb := &Seq{Prompt: 250, Out: 1}
	b.Add(bb)
	// A decodes (1 token) with 30 of KV; B's first chunk is 99 tokens from 0.
	// compute = 0.001·100 = 0.100; memory = 0.010 + 0.0001·30 = 0.013 → 0.100.
	secs, ev = step(t, b)
	if !near(secs, 0.100) || !slices.Equal(ev[a], []EventKind{EvToken}) || !slices.Equal(ev[bb], []EventKind{EvScheduled}) {
		t.Fatalf("iteration 2: %v s, A %v, B %v", secs, ev[a], ev[bb])
	}
	// A's last token (31 of KV) beside B's second chunk (99 tokens from 99): memory
	// 0.010 + 0.0001·(31 + 99) = 0.023 < compute 0.100.
	secs, ev = step(t, b)
	if !near(secs, 0.100) || !slices.Equal(ev[a], []EventKind{EvToken, EvFinished}) {
		t.Fatalf("iteration 3: %v s, A %v", secs, ev[a])
	}
	// B alone: its last 52 tokens after 198: compute 0.052, memory 0.010 + 0.0198 = 0.0298.
	secs, ev = step(t, b)
	if !near(secs, 0.052) || !slices.Equal(ev[bb], []EventKind{EvToken, EvFinished}) {
		t.Fatalf("iteration 4: %v s, B %v", secs, ev[bb])
	}
	if !near(bb.PrefillSeconds(), 0.252) || b.KVUsed() != 0 || b.Running() != 0 {
		t.Fatalf("B's prefill %v s (want 0.252), kv %d, running %d", bb.PrefillSeconds(), b.KVUsed(), b.Running())
	}
	if b.Mixed != 2 || b.Iterations != 4 {
		t.Fatalf("iterations %d, mixed %d; want 4 and 2", b.Iterations, b.Mixed)
	}
}

// Several short prompts share one iteration (batched prefill), so they pay the weight read
// once; PrefillLanes 1 prefills one at a time.
func TestBatchPacksShortPrompts(t *testing.T) {
	for _, c := range []struct {
		lanes int
		want  []float64
	}{{0, []float64{0.010}}, {1, []float64{0.010, 0.010, 0.010}}} {
		p := unitParams()
		p.PrefillLanes = c.lanes
		b := NewBatch(p)
		for i := 0; i < 3; i++ {
			b.Add(&Seq{Prompt: 3, Out: 1})
		}
		var got []float64
		for b.Running()+b.Waiting() > 0 {
			secs, _ := step(t, b)
			got = append(got, secs)
		}
		// three 3-token prompts: compute 0.009 < memory 0.010, in one iteration or three
		if len(got) != len(c.want) || !near(got[0], c.want[0]) {
			t.Errorf("lanes %d: iterations %v, want %v", c.lanes, got, c.want)
		}
	}
}

// Admission is FIFO and head of line: a request that does not fit the running slots blocks
// the ones behind it.
func TestBatchAdmitsHeadOfLine(t *testing.T) {
	p := unitParams()
	p.MaxRunning = 1
	b := NewBatch(p)
	x, y := &Seq{Prompt: 10, Out: 2}, &Seq{Prompt: 10, Out: 1}
	b.Add(x)
	b.Add(y)
	_, ev := step(t, b)
	if len(ev[y]) != 0 || b.Running() != 1 || b.Waiting() != 1 {
		t.Fatalf("y ran beside x at max_running 1: %v (running %d waiting %d)", ev[y], b.Running(), b.Waiting())
	}
	step(t, b) // x's second token: finished
	_, ev = step(t, b)
	if !slices.Equal(ev[y], []EventKind{EvScheduled, EvToken, EvFinished}) {
		t.Fatalf("y after x left: %v", ev[y])
	}
}

// KV grows as tokens are produced; when a running sequence needs a block and none is free,
// the most recently admitted one is preempted and later recomputes prompt and output.
// 6 blocks of 16 tokens: A (prompt 32) and B (prompt 48) take 2 + 3 blocks, 1 free. A's
// token 33 takes the free block; B's token 49 finds none: B (the last admitted) is preempted.
func TestBatchPreemptsWhenKVRunsOut(t *testing.T) {
	p := unitParams()
	p.KVTokens = 96
	b := NewBatch(p)
	a, bb := &Seq{Prompt: 32, Out: 20}, &Seq{Prompt: 48, Out: 20}
	b.Add(a)
	b.Add(bb)
	step(t, b) // both prefill (80 tokens ≤ 100), first tokens sampled
	if b.KVUsed() != 80 {
		t.Fatalf("kv %d after the prefills, want 80 (5 blocks)", b.KVUsed())
	}
	_, ev := step(t, b) // A needs block 3 (token 33): the last free one; B needs block 4: none
	if !slices.Contains(ev[bb], EvPreempted) || slices.Contains(ev[a], EvPreempted) {
		t.Fatalf("events A %v, B %v; want B preempted", ev[a], ev[bb])
	}
	if b.Running() != 1 || b.Waiting() != 1 || b.Preemptions != 1 || b.KVUsed() != 48 {
		t.Fatalf("running %d waiting %d preemptions %d kv %d; want 1, 1, 1, 48", b.Running(), b.Waiting(), b.Preemptions, b.KVUsed())
	}
	for b.Running()+b.Waiting() > 0 {
		step(t, b)
	}
	if a.Generated() != 20 || bb.Generated() != 20 || b.KVUsed() != 0 {
		t.Fatalf("generated %d and %d, kv %d; want 20, 20, 0", a.Generated(), bb.Generated(), b.KVUsed())
	}
}

// A prefill leg holds its KV after its one token until Release; a decode leg gets KV blocks
// for its prompt first (EvAllocated), decodes only once Ready, and pays one step for its
// first token.
func TestBatchPDLegs(t *testing.T) {
	b := NewBatch(unitParams())
	pf := &Seq{Kind: SeqPrefill, Prompt: 40, Out: 1}
	b.Add(pf)
	_, ev := step(t, b)
	if !slices.Equal(ev[pf], []EventKind{EvScheduled, EvToken, EvHeld}) || b.KVUsed() != 48 || b.Running() != 0 {
		t.Fatalf("prefill leg: %v, kv %d running %d; want [scheduled token held], 48, 0", ev[pf], b.KVUsed(), b.Running())
	}
	b.Cancel(pf) // the HTTP leg ended: its KV belongs to the hold
	if b.KVUsed() != 48 {
		t.Fatalf("cancel freed a held KV: kv %d", b.KVUsed())
	}
	b.Release(pf)
	if b.KVUsed() != 0 {
		t.Fatalf("kv %d after release", b.KVUsed())
	}
	dc := &Seq{Kind: SeqDecode, Prompt: 40, Out: 2}
	b.Add(dc)
	_, ev = step(t, b)
	if !slices.Equal(ev[dc], []EventKind{EvAllocated}) || b.KVUsed() != 48 || b.Waiting() != 1 {
		t.Fatalf("decode leg before its KV: %v, kv %d waiting %d", ev[dc], b.KVUsed(), b.Waiting())
	}
	if _, _, ok := b.Plan(); ok {
		t.Fatal("a decode leg ran before its KV arrived")
	}
	b.Ready(dc)
	// first token: one decode step over 39 tokens of KV: memory 0.010 + 0.0039
	secs, ev := step(t, b)
	if !near(secs, 0.0139) || !slices.Equal(ev[dc], []EventKind{EvScheduled, EvToken}) {
		t.Fatalf("decode leg's first step: %v s, %v; want 0.0139 and [scheduled token]", secs, ev[dc])
	}
}

// A sequence that pauses (a hung request) keeps its slot and KV but is scheduled no more.
func TestBatchPauseHoldsTheSlot(t *testing.T) {
	b := NewBatch(unitParams())
	s := &Seq{Prompt: 20, Out: 5, PauseAfter: 1}
	b.Add(s)
	step(t, b)
	if _, _, ok := b.Plan(); ok || b.Running() != 1 || b.KVUsed() != 32 {
		t.Fatalf("paused sequence: scheduled %v, running %d kv %d", ok, b.Running(), b.KVUsed())
	}
	b.Cancel(s)
	if b.Running() != 0 || b.KVUsed() != 0 {
		t.Fatalf("after cancel: running %d kv %d", b.Running(), b.KVUsed())
	}
}

// A prompt sharing whole blocks with a finished one starts from the cached prefix.
func TestBatchPrefixCache(t *testing.T) {
	b := NewBatch(unitParams())
	first := &Seq{Prompt: 40, Out: 1, Hashes: []uint64{1, 2}}
	b.Add(first)
	step(t, b)
	second := &Seq{Prompt: 40, Out: 1, Hashes: []uint64{1, 2}}
	b.Add(second)
	// 32 cached tokens; 8 to compute after them: compute 0.008, memory 0.010 + 0.0032
	secs, _ := step(t, b)
	if second.Cached() != 32 || !near(secs, 0.0132) {
		t.Fatalf("cached %d, iteration %v s; want 32 and 0.0132", second.Cached(), secs)
	}
}

func TestPrefixCacheLRU(t *testing.T) {
	var c prefixCache
	c.init()
	c.insert([]uint64{1, 2, 3}, 3) // touched back to front: 1 is the most recent
	c.insert([]uint64{4}, 3)       // evicts the least recent: 3
	if got := c.match([]uint64{1, 2, 3}); got != 2 {
		t.Fatalf("match after eviction = %d, want 2 (block 3 evicted)", got)
	}
	if got := c.match([]uint64{4}); got != 1 {
		t.Fatalf("match [4] = %d", got)
	}
	if got := c.match([]uint64{5, 1}); got != 0 {
		t.Fatalf("a prefix match stops at the first miss: got %d, want 0", got)
	}
}
