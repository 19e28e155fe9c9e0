package tokenize

import (
	"math"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// pieceCache remembers the token counts of recent pieces, process-wide: text repeats its words,
// and one load from this table (512 KiB) costs less than the vocabulary lookups of a merge. It is
// direct-mapped by the piece's hash; each slot holds the hash's upper 48 bits and the count, so a
// lookup is one atomic load and a wrong hit needs two pieces to agree on 64 bits of hash.
var pieceCache [1 << 16]atomic.Uint64

const (
	cacheIndexMask = len(pieceCache) - 1
	cacheCountBits = 16
)

func cached(h uint64) (int, bool) {
	e := pieceCache[h&uint64(cacheIndexMask)].Load()
	if e == 0 || e>>cacheCountBits != h>>cacheCountBits {
		return 0, false
	}
	return int(e & (1<<cacheCountBits - 1)), true
}

func remember(h uint64, n int) {
	if n > 0 && n < 1<<cacheCountBits {
		pieceCache[h&uint64(cacheIndexMask)].Store(h>>cacheCountBits<<cacheCountBits | uint64(n))
	}
}

// merger counts the tokens of one piece: cl100k's byte-pair merge, which repeatedly joins the
// adjacent pair whose bytes have the lowest rank (the leftmost of equal ranks) until no pair is
// a token. A heap keyed by (rank, position) finds that pair in O(log n), so a long piece (a
// paragraph of CJK text, a base64 blob) costs O(n log n), not the O(n²) of a linear scan. Its
// buffers are reused from piece to piece.
type merger struct {
	ranks *vocabulary
	next  []int32 // next part's start, or len(piece)
	prev  []int32
	gen   []int32 // bumped when a part's pair rank changes: heap entries of older gens are stale
	h     pairHeap
	// ids, when set, receives the token ranks of each piece merged (Encode's path).
	ids *[]uint32
}

type pair struct {
	rank, pos, gen int32
}

// pairHeap is a binary min-heap of pairs by (rank, pos), without container/heap's boxing.
type pairHeap []pair

func (p pair) less(q pair) bool { return p.rank < q.rank || (p.rank == q.rank && p.pos < q.pos) }

func (h *pairHeap) push(x pair) {
	*h = append(*h, x)
	a := *h
	for i := len(a) - 1; i > 0; {
		up := (i - 1) / 2
		if !a[i].less(a[up]) {
			break
		}
		a[i], a[up] = a[up], a[i]
		i = up
	}
}

func (h *pairHeap) pop() pair {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a = a[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(a) && a[l].less(a[small]) {
			small = l
		}
		if r := l + 1; r < len(a) && a[r].less(a[small]) {
			small = r
		}
		if small == i {
			break
		}
		a[i], a[small] = a[small], a[i]
		i = small
	}
	*h = a
	return top
}

// count returns the number of tokens piece encodes to.
func (m *merger) count(piece string) int {
	if len(piece) == 1 {
		return 1
	}
	h := xxhash.Sum64String(piece)
	if n, ok := cached(h); ok {
		return n
	}
	n := m.merge(piece)
	remember(h, n)
	return n
}

// encode appends the tokens of piece to *m.ids.
func (m *merger) encode(piece string) {
	if r, ok := m.ranks.rank(piece); ok {
		*m.ids = append(*m.ids, uint32(r))
		return
	}
	m.merge(piece)
}

// emit appends the token piece[from:to] to *m.ids, when collecting.
func (m *merger) emit(part string) {
	if m.ids != nil {
		r, _ := m.ranks.rank(part) // every part a merge leaves is a token (single bytes are)
		*m.ids = append(*m.ids, uint32(r))
	}
}

func (m *merger) merge(piece string) int {
	if _, ok := m.ranks.rank(piece); ok {
		m.emit(piece)
		return 1
	}
	n := len(piece)
	if n <= smallPiece {
		return m.countSmall(piece)
	}
	m.next, m.prev, m.gen = grow(m.next, n), grow(m.prev, n), grow(m.gen, n)
	m.h = m.h[:0]
	for i := range n {
		m.next[i], m.prev[i], m.gen[i] = int32(i+1), int32(i-1), 0
	}
	// rank of the pair starting at part i (i and its next part), or MaxInt32 when none.
	rank := func(i int32) int32 {
		j := m.next[i]
		if int(j) >= n {
			return math.MaxInt32
		}
		end := int32(n)
		if int(j) < n {
			end = m.next[j]
		}
		if r, ok := m.ranks.rank(piece[i:end]); ok {
			return r
		}
		return math.MaxInt32
	}
	for i := 0; i+1 < n; i++ {
		if r := rank(int32(i)); r != math.MaxInt32 {
			m.h.push(pair{r, int32(i), 0})
		}
	}
	parts := n
	for len(m.h) > 0 {
		p := m.h.pop()
		if p.gen != m.gen[p.pos] {
			continue // the part was merged or its next part changed since this entry was pushed
		}
		i := p.pos
		j := m.next[i]
		// merge part j into part i
		m.next[i] = m.next[j]
		if int(m.next[j]) < n {
			m.prev[m.next[j]] = i
		}
		m.gen[j] = -1 // j no longer starts a part
		parts--
		for _, k := range []int32{i, m.prev[i]} {
			if k < 0 {
				continue
			}
			m.gen[k]++
			if r := rank(k); r != math.MaxInt32 {
				m.h.push(pair{r, k, m.gen[k]})
			}
		}
	}
	if m.ids != nil {
		for i := int32(0); int(i) < n; i = m.next[i] {
			m.emit(piece[i:m.next[i]])
		}
	}
	return parts
}

func grow(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n, max(n, 64))
	}
	return b[:n]
}

// smallPiece: pieces up to this many bytes are merged by a linear scan for the lowest rank, as
// tiktoken does, on arrays on the stack; longer ones by the heap.
const smallPiece = 24

func (m *merger) countSmall(piece string) int {
	var start [smallPiece + 1]int32 // part k spans start[k]..start[k+1]
	var rank [smallPiece]int32      // rank of part k joined with part k+1
	n := len(piece)
	for i := 0; i <= n; i++ {
		start[i] = int32(i)
	}
	lookup := func(from, to int32) int32 {
		if r, ok := m.ranks.rank(piece[from:to]); ok {
			return r
		}
		return math.MaxInt32
	}
	parts := n
	for k := 0; k+1 < parts; k++ {
		rank[k] = lookup(start[k], start[k+2])
	}
	for parts > 1 {
		best := 0
		for k := 1; k+1 < parts; k++ {
			if rank[k] < rank[best] {
				best = k
			}
		}
		if rank[best] == math.MaxInt32 {
			break
		}
		// join part best with part best+1
		copy(start[best+1:parts], start[best+2:parts+1])
		copy(rank[best+1:parts-1], rank[best+2:parts])
		parts--
		if best+1 < parts {
			rank[best] = lookup(start[best], start[best+2])
		} else {
			rank[best] = math.MaxInt32
		}
		if best > 0 {
			rank[best-1] = lookup(start[best-1], start[best+1])
		}
	}
	if m.ids != nil {
		for k := range parts {
			m.emit(piece[start[k]:start[k+1]])
		}
	}
	return parts
}
