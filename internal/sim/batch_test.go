package sim

import (
	"slices"
	"testing"
)

// Admission is FIFO and head of line only: a request that would fit waits behind one that
// does not, and freeing room admits them in queue order.
func TestBatchAdmitsHeadOfLine(t *testing.T) {
	p := DefaultParams()
	p.MaxRunning, p.KVTokens = 2, 100
	b := NewBatch(p)
	var order []string
	enqueue := func(name string, need int) *Ticket {
		return b.Enqueue(need, func() { order = append(order, name) })
	}
	enqueue("a", 60)        // fits: admitted at once
	enqueue("big", 50)      // 60+50 > 100: waits
	enqueue("small", 10)    // would fit, but waits behind the head
	last := enqueue("x", 1) // behind the other two
	if want := []string{"a"}; !slices.Equal(order, want) || b.Running() != 1 || b.KVUsed() != 60 || b.Queued() != 3 {
		t.Fatalf("after enqueue: admitted %v running %d kv %d queued %d; want %v, 1, 60, 3", order, b.Running(), b.KVUsed(), b.Queued(), want)
	}
	b.Withdraw(last) // gives up while queued: leaves the queue, frees nothing
	b.Leave(true, 60)
	// big (50) and small (10) now fit; MaxRunning 2 stops there.
	if want := []string{"a", "big", "small"}; !slices.Equal(order, want) || b.Running() != 2 || b.KVUsed() != 60 || b.Queued() != 0 {
		t.Fatalf("after leave: admitted %v running %d kv %d queued %d; want %v, 2, 60, 0", order, b.Running(), b.KVUsed(), b.Queued(), want)
	}
}

// A ticket withdrawn after admission gives back its slot and KV; a slot can be left while
// the KV stays reserved (a prefill leg's KV waiting for its decode leg).
func TestBatchWithdrawAndKeepKV(t *testing.T) {
	p := DefaultParams()
	p.MaxRunning = 1
	b := NewBatch(p)
	a := b.Enqueue(100, func() {})
	b.Withdraw(a)
	if b.Running() != 0 || b.KVUsed() != 0 {
		t.Fatalf("withdrawn after admission: running %d kv %d, want 0 and 0", b.Running(), b.KVUsed())
	}
	b.Enqueue(40, func() {})
	b.Leave(true, 0)
	if b.Running() != 0 || b.KVUsed() != 40 {
		t.Fatalf("slot left, KV kept: running %d kv %d, want 0 and 40", b.Running(), b.KVUsed())
	}
	b.Leave(false, 40)
	if b.KVUsed() != 0 {
		t.Fatalf("KV freed: kv %d, want 0", b.KVUsed())
	}
}

// A chunk's iteration carries the decode step of the sequences decoding; a decode step that
// starts while a chunk computes pays for it. Numbers: DecodeBase 0.010 + 0.0002 per sequence.
func TestBatchChunkStepping(t *testing.T) {
	b := NewBatch(DefaultParams())
	for _, c := range []struct {
		what     string
		do       func() float64
		want     float64
		stalling bool // Stalling() after do
	}{
		{"idle pod, chunk 0.1", func() float64 { return b.BeginChunk(0.1) }, 0.1, true},
		{"decode step of 1 during that chunk", func() float64 { return b.Step(1) }, 0.1 + 0.0102, true},
		{"chunk ends, 3 start decoding; step of 0 sequences counts one", func() float64 {
			b.EndChunk(0.1)
			b.AddDecoding(3)
			return b.Step(0)
		}, 0.0102, false},
		{"chunk 0.05 with 3 decoding", func() float64 { return b.BeginChunk(0.05) }, 0.05 + 0.0106, true},
	} {
		if got := c.do(); !near(got, c.want) || b.Stalling() != c.stalling {
			t.Errorf("%s = %v (stalling %v), want %v (stalling %v)", c.what, got, b.Stalling(), c.want, c.stalling)
		}
	}
}

// The prefix cache holds at most the blocks the KV reservations leave free.
func TestBatchRememberBoundedByFreeKV(t *testing.T) {
	p := DefaultParams()
	p.KVTokens, p.BlockSize = 64, 16 // 4 blocks
	b := NewBatch(p)
	b.Enqueue(32, func() {}) // 2 blocks reserved, 2 free
	b.Remember([]uint64{1, 2, 3})
	if got := b.CachedBlocks(); got != 2 {
		t.Fatalf("cached blocks %d, want 2 (4 blocks of KV, 2 reserved)", got)
	}
	if got := b.Lookup([]uint64{1, 2, 3}); got != 2 {
		t.Fatalf("lookup = %d, want 2 (the first blocks are evicted last)", got)
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
