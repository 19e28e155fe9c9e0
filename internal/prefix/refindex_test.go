package prefix

// refIndex is the prefix index as it was before matching and warming worked on per-block sets
// of endpoint numbers (main at e942dac, types renamed, doc comments left as they were): the
// reference TestIndexBehavesAsBefore holds the index to, warm for warm and match for match.

import (
	"sync"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
)

// Index maps (model, block hash) to the endpoints that recently served that block.
// Safe for concurrent use: Match takes a read lock, Add a write lock.
type refIndex struct {
	opts Options

	mu     sync.RWMutex
	models map[string]map[uint64]*refBlock
	// lru is a ring through every block, most recently warmed after the sentinel.
	lru   refBlock
	count int
	// holders is, per endpoint, the ring of its holdings most recently warmed first; kept
	// only when a per-endpoint bound applies.
	holders map[string]*refHolding
	// keys numbers the endpoints holding blocks, so that matching follows a prompt's runs in
	// a slice indexed by number instead of a map hashing every holder's key at every block.
	keys refKeyTable
}

// keyTable interns endpoint keys as small numbers; a number is reused once no block
// holds its endpoint.
type refKeyTable struct {
	ids   map[string]int32
	names []string
	refs  []int32 // holders (block, endpoint) naming each number
	free  []int32
}

// ref numbers key, counting one more holder of it.
func (t *refKeyTable) ref(key string) int32 {
	id, ok := t.ids[key]
	if !ok {
		if t.ids == nil {
			t.ids = map[string]int32{}
		}
		if n := len(t.free); n > 0 {
			id, t.free = t.free[n-1], t.free[:n-1]
			t.names[id] = key
		} else {
			id = int32(len(t.names))
			t.names, t.refs = append(t.names, key), append(t.refs, 0)
		}
		t.ids[key] = id
	}
	t.refs[id]++
	return id
}

// unref counts one holder of id fewer, releasing the number with the last.
func (t *refKeyTable) unref(id int32) {
	if t.refs[id]--; t.refs[id] == 0 {
		delete(t.ids, t.names[id])
		t.names[id] = ""
		t.free = append(t.free, id)
	}
}

type refBlock struct {
	model      string
	hash       uint64
	holders    []refHolder
	prev, next *refBlock
}

type refHolder struct {
	key  string
	id   int32 // key's number in the index's keyTable
	seen int64 // unix nanoseconds of the last warm
	// at is this holding in the endpoint's ring (nil without a per-endpoint bound).
	at *refHolding
}

// holding is one (block, endpoint) pair in that endpoint's ring; the ring's sentinel
// counts the endpoint's holdings.
type refHolding struct {
	b          *refBlock
	prev, next *refHolding
	n          int // on the sentinel: holdings in the ring
}

// NewIndex returns an empty index.
func newRefIndex(opts Options) *refIndex {
	if opts.MaxBlocks <= 0 {
		opts.MaxBlocks = 200000
	}
	if opts.Eviction <= 0 {
		opts.Eviction = 20 * time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = load.SystemClock{}
	}
	ix := &refIndex{opts: opts, models: map[string]map[uint64]*refBlock{}}
	ix.lru.next, ix.lru.prev = &ix.lru, &ix.lru
	return ix
}

// Len is the number of blocks held.
func (ix *refIndex) Len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.count
}

// Match calls found(key, pct) for every endpoint holding a prefix of the prompt, with
// pct = matched blocks · 100 / len(hashes), the longest run of leading blocks the endpoint
// holds. Endpoints holding nothing are not reported (their match is 0). The cost is linear
// in the holders of the blocks walked, however many endpoints share a prefix.
func (ix *refIndex) Match(model string, hashes []uint64, found func(key string, pct float64)) {
	total := float64(len(hashes))
	ix.MatchBlocks(model, hashes, func(key string, n int) { found(key, float64(n)*100/total) })
}

// MatchBlocks is Match reporting the number of leading blocks each endpoint holds.
func (ix *refIndex) MatchBlocks(model string, hashes []uint64, found func(key string, blocks int)) {
	if len(hashes) == 0 {
		return
	}
	cutoff := ix.opts.Clock.Now().Add(-ix.opts.Eviction).UnixNano()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	m := ix.models[model]
	if m == nil {
		return
	}
	b := m[hashes[0]]
	if b == nil {
		return
	}
	// first are the holders of the first block; run[id] the leading blocks endpoint id
	// holds while it holds every block walked so far.
	first := make([]int32, 0, len(b.holders))
	run := make([]int32, len(ix.keys.names))
	for _, hd := range b.holders {
		if hd.seen >= cutoff {
			first = append(first, hd.id)
			run[hd.id] = 1
		}
	}
	for i := 1; i < len(hashes) && len(first) > 0; i++ {
		b := m[hashes[i]]
		if b == nil {
			break
		}
		extended := false
		for _, hd := range b.holders {
			if hd.seen >= cutoff && run[hd.id] == int32(i) {
				run[hd.id] = int32(i + 1)
				extended = true
			}
		}
		if !extended {
			break
		}
	}
	for _, id := range first {
		found(ix.keys.names[id], int(run[id]))
	}
}

// Add records that endpoint key now holds every block of the prompt.
func (ix *refIndex) Add(model string, hashes []uint64, key string) {
	ix.AddCapped(model, hashes, key, ix.opts.MaxBlocksPerHolder)
}

// AddCapped is Add with the endpoint's own bound on the blocks it is remembered for
// (0: Options.MaxBlocksPerHolder).
func (ix *refIndex) AddCapped(model string, hashes []uint64, key string, capacity int) {
	if len(hashes) == 0 {
		return
	}
	if capacity <= 0 {
		capacity = ix.opts.MaxBlocksPerHolder
	}
	now := ix.opts.Clock.Now().UnixNano()
	cutoff := now - int64(ix.opts.Eviction)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	m := ix.models[model]
	if m == nil {
		m = map[uint64]*refBlock{}
		ix.models[model] = m
	}
	// The key's number, held for the walk (its holdings are compared by number).
	id := ix.keys.ref(key)
	defer ix.keys.unref(id)
	// Walk backwards so the first block ends up most recent: eviction then trims a
	// prompt from its tail, and what stays is still a usable prefix.
	for i := len(hashes) - 1; i >= 0; i-- {
		b := m[hashes[i]]
		if b == nil {
			b = &refBlock{model: model, hash: hashes[i]}
			m[hashes[i]] = b
			ix.count++
		} else {
			ix.unlink(b)
		}
		ix.touch(b, key, id, now, cutoff, capacity > 0)
		ix.pushFront(b)
	}
	if capacity > 0 {
		ix.trim(key, capacity)
	}
	for ix.count > ix.opts.MaxBlocks {
		ix.evict(ix.lru.prev)
	}
}

// touch marks key (numbered id) as a holder of b now and drops holders past the eviction age; with
// ring, the holding moves to the front of the endpoint's ring.
func (ix *refIndex) touch(b *refBlock, key string, id int32, now, cutoff int64, ring bool) {
	n, found := 0, false
	for _, h := range b.holders {
		if h.id == id {
			h.seen, found = now, true
			if ring {
				if h.at == nil {
					h.at = &refHolding{b: b}
				} else {
					ix.release(h.key, h.at)
				}
				ix.hold(key, h.at)
			}
		}
		if h.seen >= cutoff {
			b.holders[n] = h
			n++
		} else {
			if h.at != nil {
				ix.release(h.key, h.at)
			}
			ix.keys.unref(h.id)
		}
	}
	b.holders = b.holders[:n]
	if !found {
		ix.keys.refs[id]++
		h := refHolder{key: key, id: id, seen: now}
		if ring {
			h.at = &refHolding{b: b}
			ix.hold(key, h.at)
		}
		b.holders = append(b.holders, h)
	}
}

// hold puts a holding at the front of key's ring.
func (ix *refIndex) hold(key string, at *refHolding) {
	if ix.holders == nil {
		ix.holders = map[string]*refHolding{}
	}
	r := ix.holders[key]
	if r == nil {
		r = &refHolding{}
		r.next, r.prev = r, r
		ix.holders[key] = r
	}
	at.next, at.prev = r.next, r
	r.next.prev = at
	r.next = at
	r.n++
}

// release takes a holding out of key's ring.
func (ix *refIndex) release(key string, at *refHolding) {
	if at.next == nil {
		return
	}
	at.prev.next, at.next.prev = at.next, at.prev
	at.prev, at.next = nil, nil
	if r := ix.holders[key]; r != nil {
		if r.n--; r.n == 0 {
			delete(ix.holders, key)
		}
	}
}

// trim makes key forget its least recently warmed blocks until it holds at most capacity.
func (ix *refIndex) trim(key string, capacity int) {
	r := ix.holders[key]
	for r != nil && r.n > capacity {
		old := r.prev
		ix.release(key, old)
		if b := old.b; ix.without(b, key) == 0 {
			ix.unlink(b)
			ix.drop(b)
		}
		r = ix.holders[key]
	}
}

// without drops key from the block's holders and returns how many are left.
func (ix *refIndex) without(b *refBlock, key string) int {
	n := 0
	for _, h := range b.holders {
		if h.key != key {
			b.holders[n] = h
			n++
		} else {
			ix.keys.unref(h.id)
		}
	}
	b.holders = b.holders[:n]
	return n
}

func (ix *refIndex) unlink(b *refBlock) {
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
}

func (ix *refIndex) pushFront(b *refBlock) {
	b.next, b.prev = ix.lru.next, &ix.lru
	ix.lru.next.prev = b
	ix.lru.next = b
}

func (ix *refIndex) evict(b *refBlock) {
	if b == &ix.lru {
		return
	}
	ix.unlink(b)
	for _, h := range b.holders {
		if h.at != nil {
			ix.release(h.key, h.at)
		}
		ix.keys.unref(h.id)
	}
	b.holders = nil
	ix.drop(b)
}

// drop removes an unlinked block from its model's map.
func (ix *refIndex) drop(b *refBlock) {
	m := ix.models[b.model]
	delete(m, b.hash)
	if len(m) == 0 {
		delete(ix.models, b.model)
	}
	ix.count--
}

// Forget removes an endpoint from every block (it left the pool). O(blocks).
func (ix *refIndex) Forget(key string) { ix.ForgetAll(map[string]struct{}{key: {}}) }

// ForgetAll removes the endpoints from every block in one pass over the index, O(blocks)
// whatever their number: a pool change that retires many endpoints costs one walk.
func (ix *refIndex) ForgetAll(keys map[string]struct{}) {
	if len(keys) == 0 {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for b := ix.lru.next; b != &ix.lru; {
		next := b.next
		n := 0
		for _, h := range b.holders {
			if _, gone := keys[h.key]; gone {
				if h.at != nil {
					ix.release(h.key, h.at)
				}
				ix.keys.unref(h.id)
				continue
			}
			b.holders[n] = h
			n++
		}
		b.holders = b.holders[:n]
		if n == 0 {
			ix.evict(b)
		}
		b = next
	}
	for k := range keys {
		delete(ix.holders, k)
	}
}
