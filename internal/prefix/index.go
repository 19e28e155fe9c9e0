package prefix

import (
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
}

type block struct {
	model      string
	hash       uint64
	holders    []holder
	prev, next *block
}

type holder struct {
	key  string
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
	var run map[string]int // endpoint -> leading blocks held
	for i, h := range hashes {
		b := m[h]
		if b == nil {
			break
		}
		extended := 0
		for _, hd := range b.holders {
			if hd.seen < cutoff {
				continue
			}
			if i == 0 {
				if run == nil {
					run = make(map[string]int, len(b.holders))
				}
				run[hd.key] = 1
				extended++
			} else if run[hd.key] == i {
				run[hd.key] = i + 1
				extended++
			}
		}
		if extended == 0 {
			break
		}
	}
	for key, n := range run {
		found(key, n)
	}
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
	// Walk backwards so the first block ends up most recent: eviction then trims a
	// prompt from its tail, and what stays is still a usable prefix.
	for i := len(hashes) - 1; i >= 0; i-- {
		b := m[hashes[i]]
		if b == nil {
			b = &block{model: model, hash: hashes[i]}
			m[hashes[i]] = b
			ix.count++
		} else {
			ix.unlink(b)
		}
		ix.touch(b, key, now, cutoff, capacity > 0)
		ix.pushFront(b)
	}
	if capacity > 0 {
		ix.trim(key, capacity)
	}
	for ix.count > ix.opts.MaxBlocks {
		ix.evict(ix.lru.prev)
	}
}

// touch marks key as a holder of b now and drops holders past the eviction age; with
// ring, the holding moves to the front of the endpoint's ring.
func (ix *Index) touch(b *block, key string, now, cutoff int64, ring bool) {
	n, found := 0, false
	for _, h := range b.holders {
		if h.key == key {
			h.seen, found = now, true
			if ring {
				if h.at == nil {
					h.at = &holding{b: b}
				} else {
					ix.release(h.key, h.at)
				}
				ix.hold(key, h.at)
			}
		}
		if h.seen >= cutoff {
			b.holders[n] = h
			n++
		} else if h.at != nil {
			ix.release(h.key, h.at)
		}
	}
	b.holders = b.holders[:n]
	if !found {
		h := holder{key: key, seen: now}
		if ring {
			h.at = &holding{b: b}
			ix.hold(key, h.at)
		}
		b.holders = append(b.holders, h)
	}
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
		if b := old.b; b.without(key) == 0 {
			ix.unlink(b)
			ix.drop(b)
		}
		r = ix.holders[key]
	}
}

// without drops key from the block's holders and returns how many are left.
func (b *block) without(key string) int {
	n := 0
	for _, h := range b.holders {
		if h.key != key {
			b.holders[n] = h
			n++
		}
	}
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
	}
	ix.drop(b)
}

// drop removes an unlinked block from its model's map.
func (ix *Index) drop(b *block) {
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
