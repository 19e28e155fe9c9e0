package pool

import (
	"fmt"
	"sync/atomic"
)

// Memo is a slot on every Endpoint where another package keeps what it derives from the
// endpoint's key — a tracker's counter, a pod's latency model — so that a pick reaches it
// without hashing the key into a map for every candidate at every step. A package reserves
// its slots once, at init (NewMemo); an entry names its owner (the tracker or model
// instance) and the owner's generation, so two instances sharing endpoints never read each
// other's entries, and an owner that forgot keys (bumping its generation) never reads a
// stale one. An Endpoint is immutable otherwise; a memo is only a cache of what the owner
// would find by key.
type Memo struct{ slot int }

// memoSlots bounds the slots reserved across the program (each costs 8 bytes per endpoint).
const memoSlots = 6

var memosReserved atomic.Int32

// NewMemo reserves a slot. Call it from a package-level var: the slots are few.
func NewMemo() Memo {
	n := int(memosReserved.Add(1)) - 1
	if n >= memoSlots {
		panic(fmt.Sprintf("pool: more than %d endpoint memos reserved", memoSlots)) // a programming error
	}
	return Memo{n}
}

// memoOwners is how many owners one slot keeps at once. A process has a few of one kind: the
// load package's slot serves the running counts (picker.Deps), the PD cascade's prefill and
// pending-decode counts and the fallback least-request strategy's; the latency package's
// serves one Models. Past it the oldest is dropped, which costs that owner one lookup by key
// (and, should more owners alternate, an allocation per store).
const memoOwners = 4

type memoEntry struct {
	owner any
	gen   uint64
	v     any
}

// memoSet is a slot's entries, replaced whole on every store (readers never lock).
type memoSet struct {
	n int
	e [memoOwners]memoEntry
}

// Load returns the value owner stored on e at generation gen.
func (m Memo) Load(e *Endpoint, owner any, gen uint64) (any, bool) {
	set := e.memos[m.slot].Load()
	if set == nil {
		return nil, false
	}
	for i := 0; i < set.n; i++ {
		if en := &set.e[i]; en.owner == owner {
			return en.v, en.gen == gen
		}
	}
	return nil, false
}

// Store keeps v on e for owner at generation gen (the owner read gen before it looked v up,
// so a change that bumps the generation after that lookup makes this entry stale).
func (m Memo) Store(e *Endpoint, owner any, gen uint64, v any) {
	slot := &e.memos[m.slot]
	for {
		old := slot.Load()
		next := &memoSet{}
		next.e[0] = memoEntry{owner: owner, gen: gen, v: v}
		next.n = 1
		if old != nil {
			for i := 0; i < old.n && next.n < memoOwners; i++ {
				if old.e[i].owner != owner {
					next.e[next.n] = old.e[i]
					next.n++
				}
			}
		}
		if slot.CompareAndSwap(old, next) {
			return
		}
	}
}
