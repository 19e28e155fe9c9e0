package prefix

import (
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
)

// Options bound an Index.
type Options struct {
	// MaxBlocks is the most blocks held across all models (AIBRIX_PREFIX_CACHE_BLOCK_NUMBER);
	// the least recently warmed block goes first. Default 200000.
	MaxBlocks int
	// Eviction is how long an endpoint is remembered for a block after its last warm
	// (AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS). Default 20 minutes.
	Eviction time.Duration
	// MaxBlocksPerHolder, when positive, bounds the blocks remembered for each endpoint
	// (llm-d's lruCapacityPerServer): past it, the endpoint's least recently warmed block
	// forgets it. AddCapped may set a different bound per endpoint. 0: no per-endpoint bound.
	MaxBlocksPerHolder int
	Clock              load.Clock
}

// Index maps (model, block hash) to the endpoints that recently served that block.
// Safe for concurrent use: Match takes a read lock, Add a write lock.
type Index struct {
	opts Options

	mu     sync.RWMutex
	models map[string]map[uint64]*block
	// lru is a ring through every block, most recently warmed after the sentinel.
	lru   block
	count int
	// holders is, per endpoint, the ring of its holdings most recently warmed first; kept
	// only when a per-endpoint bound applies.
	holders map[string]*holding
	// keys numbers the endpoints holding blocks, so that matching follows a prompt's runs in
	// a slice indexed by number instead of a map hashing every holder's key at every block.
	keys keyTable
}

// keyTable interns endpoint keys as small numbers; a number is reused once no block
// holds its endpoint.
type keyTable struct {
	ids   map[string]int32
	names []string
	refs  []int32 // holders (block, endpoint) naming each number
	free  []int32
}

// ref numbers key, counting one more holder of it.
func (t *keyTable) ref(key string) int32 {
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
func (t *keyTable) unref(id int32) {
	if t.refs[id]--; t.refs[id] == 0 {
		delete(t.ids, t.names[id])
		t.names[id] = ""
		t.free = append(t.free, id)
	}
}

type block struct {
	model   string
	hash    uint64
	holders []holder
	// held has a bit for the number of each holder: matching intersects these sets along the
	// prompt, a few words per block, instead of visiting every holder of every block.
	held []uint64
	// oldest is at most the earliest last warm of the holders (exact after a pass that drops the
	// aged ones): while it is within the eviction age no holder has aged, so held is exactly the
	// live holders and a warm has nothing to drop.
	oldest     int64
	prev, next *block
	// succ is the block that followed this one in the last prompt warmed through it, a
	// shortcut for the lookup of the next block of a prompt sharing that much (prompts that
	// share a block share what precedes it, and often what follows). It may have been dropped
	// since: a block is in its model's map exactly while it has holders.
	succ *block
}

// follow is the block of model map m with hash h, coming from b: b's successor when it is that
// block, else the map's.
func (b *block) follow(m map[uint64]*block, h uint64) *block {
	if s := b.succ; s != nil && s.hash == h && len(s.holders) > 0 {
		return s
	}
	return m[h]
}

// has reports whether endpoint number id holds b.
func (b *block) has(id int32) bool {
	w := int(id >> 6)
	return w < len(b.held) && b.held[w]&(1<<(id&63)) != 0
}

func (b *block) mark(id int32) {
	w := int(id >> 6)
	for len(b.held) <= w {
		b.held = append(b.held, 0)
	}
	b.held[w] |= 1 << (id & 63)
}

func (b *block) unmark(id int32) {
	if w := int(id >> 6); w < len(b.held) {
		b.held[w] &^= 1 << (id & 63)
	}
}

// live is the set of b's holders warmed at or after cutoff: held itself while none has aged,
// else computed into scratch (as many words as the key table needs).
func (b *block) live(cutoff int64, scratch []uint64) []uint64 {
	if b.oldest >= cutoff {
		return b.held
	}
	clear(scratch)
	for _, h := range b.holders {
		if h.seen >= cutoff {
			scratch[h.id>>6] |= 1 << (h.id & 63)
		}
	}
	return scratch
}

type holder struct {
	key  string
	id   int32 // key's number in the index's keyTable
	seen int64 // unix nanoseconds of the last warm
	// at is this holding in the endpoint's ring (nil without a per-endpoint bound).
	at *holding
}

// holding is one (block, endpoint) pair in that endpoint's ring; the ring's sentinel
// counts the endpoint's holdings.
type holding struct {
	b          *block
	prev, next *holding
	n          int // on the sentinel: holdings in the ring
}

// NewIndex returns an empty index.
func NewIndex(opts Options) *Index {
	if opts.MaxBlocks <= 0 {
		opts.MaxBlocks = 200000
	}
	if opts.Eviction <= 0 {
		opts.Eviction = 20 * time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = load.SystemClock{}
	}
	ix := &Index{opts: opts, models: map[string]map[uint64]*block{}}
	ix.lru.next, ix.lru.prev = &ix.lru, &ix.lru
	return ix
}

// Len is the number of blocks held.
func (ix *Index) Len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.count
}

// Match calls found(key, pct) for every endpoint holding a prefix of the prompt, with
// pct = matched blocks · 100 / len(hashes), the longest run of leading blocks the endpoint
// holds. Endpoints holding nothing are not reported (their match is 0). The cost is linear
// in the holders of the blocks walked, however many endpoints share a prefix.
func (ix *Index) Match(model string, hashes []uint64, found func(key string, pct float64)) {
	total := float64(len(hashes))
	ix.MatchBlocks(model, hashes, func(key string, n int) { found(key, float64(n)*100/total) })
}

// MatchBlocks is Match reporting the number of leading blocks each endpoint holds.
func (ix *Index) MatchBlocks(model string, hashes []uint64, found func(key string, blocks int)) {
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
	// running is the set of endpoints holding every block walked so far; an endpoint leaving
	// it at block n holds n leading blocks, run[id].
	sc := matchScratchPool.Get().(*matchScratch)
	defer matchScratchPool.Put(sc)
	running, fresh, run := sc.size(len(ix.keys.names))
	if clear(running); copy(running, b.live(cutoff, fresh)) == 0 {
		return
	}
	n := 1
	for at := b; n < len(hashes); n++ {
		if at = at.follow(m, hashes[n]); at == nil {
			break
		}
		b := at
		live, left := b.live(cutoff, fresh), false
		for w, r := range running {
			if r == 0 {
				continue
			}
			var l uint64
			if w < len(live) {
				l = live[w]
			}
			for gone := r &^ l; gone != 0; gone &= gone - 1 {
				run[w<<6|bits.TrailingZeros64(gone)] = int32(n)
			}
			running[w] = r & l
			left = left || r&l != 0
		}
		if !left {
			break
		}
	}
	for w, r := range running {
		for ; r != 0; r &= r - 1 {
			run[w<<6|bits.TrailingZeros64(r)] = int32(n)
		}
	}
	// Reported in the order the first block lists its holders.
	for _, hd := range b.holders {
		if hd.seen >= cutoff {
			found(hd.key, int(run[hd.id]))
		}
	}
}

// matchScratch is MatchBlocks' working memory, pooled so a match allocates nothing.
type matchScratch struct {
	running, fresh []uint64
	run            []int32
}

var matchScratchPool = sync.Pool{New: func() any { return new(matchScratch) }}

// size returns the scratch sets and runs for keys numbered below n (the sets' contents are
// left over from the last match; run entries are written before they are read).
func (s *matchScratch) size(n int) (running, fresh []uint64, run []int32) {
	words := (n + 63) / 64
	if cap(s.running) < words {
		s.running, s.fresh = make([]uint64, words), make([]uint64, words)
	}
	if cap(s.run) < n {
		s.run = make([]int32, n)
	}
	return s.running[:words], s.fresh[:words], s.run[:n]
}

// Add records that endpoint key now holds every block of the prompt.
func (ix *Index) Add(model string, hashes []uint64, key string) {
	ix.AddCapped(model, hashes, key, ix.opts.MaxBlocksPerHolder)
}

// AddCapped is Add with the endpoint's own bound on the blocks it is remembered for
// (0: Options.MaxBlocksPerHolder).
func (ix *Index) AddCapped(model string, hashes []uint64, key string, capacity int) {
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
		m = map[uint64]*block{}
		ix.models[model] = m
	}
	// The key's number, held for the walk (its holdings are compared by number).
	id := ix.keys.ref(key)
	defer ix.keys.unref(id)
	// Walk backwards so the first block ends up most recent: eviction then trims a
	// prompt from its tail, and what stays is still a usable prefix.
	var after *block
	hint := 0 // where the key was among the last block's holders
	for i := len(hashes) - 1; i >= 0; i-- {
		b := m[hashes[i]]
		if b == nil {
			b = &block{model: model, hash: hashes[i]}
			m[hashes[i]] = b
			ix.count++
		} else {
			ix.unlink(b)
		}
		hint = ix.touch(b, key, id, hint, now, cutoff, capacity > 0)
		ix.pushFront(b)
		if after != nil {
			b.succ = after
		}
		after = b
	}
	if capacity > 0 {
		ix.trim(key, capacity)
	}
	for ix.count > ix.opts.MaxBlocks {
		ix.evict(ix.lru.prev)
	}
}

// touch marks key (numbered id) as a holder of b now and drops holders past the eviction age; with
// ring, the holding moves to the front of the endpoint's ring. Holders keep their order: the ones
// kept stay where they were and a new one goes last. It returns where the holder is among b's:
// the blocks of a prompt warmed together list their holders alike, so that position, the hint
// passed for the next block, usually finds the holder at once.
func (ix *Index) touch(b *block, key string, id int32, hint int, now, cutoff int64, ring bool) int {
	if b.oldest < cutoff {
		ix.dropAged(b, id, cutoff)
	}
	if b.has(id) {
		if hint >= len(b.holders) || b.holders[hint].id != id {
			hint = slices.IndexFunc(b.holders, func(h holder) bool { return h.id == id })
		}
		h := &b.holders[hint]
		h.seen = now
		if ring {
			if h.at == nil {
				h.at = &holding{b: b}
			} else {
				ix.release(h.key, h.at)
			}
			ix.hold(key, h.at)
		}
	} else {
		ix.keys.refs[id]++
		h := holder{key: key, id: id, seen: now}
		if ring {
			h.at = &holding{b: b}
			ix.hold(key, h.at)
		}
		if len(b.holders) == 0 {
			b.oldest = now
		}
		hint = len(b.holders)
		b.holders = append(b.holders, h)
		b.mark(id)
	}
	b.oldest = min(b.oldest, now)
	return hint
}

// dropAged drops b's holders last warmed before cutoff, but keep (the endpoint being warmed), and
// makes b.oldest the earliest warm of the others (touch then counts keep's, now).
func (ix *Index) dropAged(b *block, keep int32, cutoff int64) {
	n, oldest := 0, int64(math.MaxInt64)
	for _, h := range b.holders {
		if h.seen >= cutoff || h.id == keep {
			b.holders[n] = h
			n++
			if h.id != keep {
				oldest = min(oldest, h.seen)
			}
			continue
		}
		if h.at != nil {
			ix.release(h.key, h.at)
		}
		b.unmark(h.id)
		ix.keys.unref(h.id)
	}
	clear(b.holders[n:])
	b.holders, b.oldest = b.holders[:n], oldest
}

// hold puts a holding at the front of key's ring.
func (ix *Index) hold(key string, at *holding) {
	if ix.holders == nil {
		ix.holders = map[string]*holding{}
	}
	r := ix.holders[key]
	if r == nil {
		r = &holding{}
		r.next, r.prev = r, r
		ix.holders[key] = r
	}
	at.next, at.prev = r.next, r
	r.next.prev = at
	r.next = at
	r.n++
}

// release takes a holding out of key's ring.
func (ix *Index) release(key string, at *holding) {
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
func (ix *Index) trim(key string, capacity int) {
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
func (ix *Index) without(b *block, key string) int {
	n := 0
	for _, h := range b.holders {
		if h.key != key {
			b.holders[n] = h
			n++
		} else {
			b.unmark(h.id)
			ix.keys.unref(h.id)
		}
	}
	clear(b.holders[n:])
	b.holders = b.holders[:n]
	return n
}

func (ix *Index) unlink(b *block) {
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
}

func (ix *Index) pushFront(b *block) {
	b.next, b.prev = ix.lru.next, &ix.lru
	ix.lru.next.prev = b
	ix.lru.next = b
}

func (ix *Index) evict(b *block) {
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
	b.holders, b.held = nil, nil
	ix.drop(b)
}

// drop removes an unlinked block from its model's map.
func (ix *Index) drop(b *block) {
	b.holders, b.held, b.succ = nil, nil, nil // no holders: what a successor shortcut checks
	m := ix.models[b.model]
	delete(m, b.hash)
	if len(m) == 0 {
		delete(ix.models, b.model)
	}
	ix.count--
}

// Forget removes an endpoint from every block (it left the pool). O(blocks).
func (ix *Index) Forget(key string) { ix.ForgetAll(map[string]struct{}{key: {}}) }

// ForgetAll removes the endpoints from every block in one pass over the index, O(blocks)
// whatever their number: a pool change that retires many endpoints costs one walk.
func (ix *Index) ForgetAll(keys map[string]struct{}) {
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
				b.unmark(h.id)
				ix.keys.unref(h.id)
				continue
			}
			b.holders[n] = h
			n++
		}
		clear(b.holders[n:])
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
