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
	Clock    load.Clock
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
	total := float64(len(hashes))
	for key, n := range run {
		found(key, float64(n)*100/total)
	}
}

// Add records that endpoint key now holds every block of the prompt.
func (ix *Index) Add(model string, hashes []uint64, key string) {
	if len(hashes) == 0 {
		return
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
		b.touch(key, now, cutoff)
		ix.pushFront(b)
	}
	for ix.count > ix.opts.MaxBlocks {
		ix.evict(ix.lru.prev)
	}
}

// touch marks key as a holder now and drops holders past the eviction age.
func (b *block) touch(key string, now, cutoff int64) {
	n, found := 0, false
	for _, h := range b.holders {
		if h.key == key {
			h.seen, found = now, true
		}
		if h.seen >= cutoff {
			b.holders[n] = h
			n++
		}
	}
	b.holders = b.holders[:n]
	if !found {
		b.holders = append(b.holders, holder{key: key, seen: now})
	}
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
	m := ix.models[b.model]
	delete(m, b.hash)
	if len(m) == 0 {
		delete(ix.models, b.model)
	}
	ix.count--
}

// Forget removes an endpoint from every block (it left the pool). O(blocks).
func (ix *Index) Forget(key string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for b := ix.lru.next; b != &ix.lru; {
		next := b.next
		n := 0
		for _, h := range b.holders {
			if h.key != key {
				b.holders[n] = h
				n++
			}
		}
		b.holders = b.holders[:n]
		if n == 0 {
			ix.evict(b)
		}
		b = next
	}
}
