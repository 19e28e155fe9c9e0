package tokenize

import (
	"sync"
	"unicode/utf8"
)

// Count returns the number of cl100k_base tokens of text, counting no further than limit: once
// the count reaches limit it stops and returns complete=false with n ≥ limit (limit ≤ 0: no
// limit). It fails only if the embedded vocabulary cannot be read.
func Count(text string, limit int) (n int, complete bool, err error) {
	l := NewLength(text)
	n, err = l.countTo(limit)
	return n, l.off == len(l.text), err
}

// AppendIDs appends the cl100k_base token ids of text to dst, each as four big-endian bytes (the
// layout AIBrix hashes its prefix blocks over with AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE=tiktoken).
func AppendIDs(dst []byte, text string) ([]byte, error) {
	v, err := vocab()
	if err != nil {
		return dst, err
	}
	text = validUTF8(text)
	var ids []uint32
	m := &merger{ranks: v, ids: &ids}
	for off := 0; off < len(text); {
		end := piece(text, off)
		m.encode(text[off:end])
		off = end
	}
	for _, id := range ids {
		dst = append(dst, byte(id>>24), byte(id>>16), byte(id>>8), byte(id))
	}
	return dst, nil
}

func validUTF8(text string) string {
	if utf8.ValidString(text) {
		return text
	}
	// tiktoken-go reads the text as runes: each invalid byte is one U+FFFD.
	return string([]rune(text))
}

// Every cl100k_base token is at least one byte and at most maxTokenBytes (its longest token is
// 128 spaces), so the uncounted rest of a text of r bytes holds between ⌈r/maxTokenBytes⌉ and r
// tokens. A tighter lower bound costs a scan of the rest into pieces (no merging): each piece
// is at least ⌈len/maxTokenBytes⌉ tokens, at least one. Natural text is about one piece a token;
// a fixed bytes-per-token bound is not safe: "=" rules, column padding and deep indentation
// pack 17 to 128 bytes into a token. A decision stops counting once no boundary lies between
// the bounds of what is counted plus the rest.
const maxTokenBytes = 128

// pieceMin is the fewest tokens a piece of n bytes encodes to.
func pieceMin(n int) int { return (n + maxTokenBytes - 1) / maxTokenBytes }

// Length is one prompt's length in tokens, counted as far as the decisions asked about it need,
// each token at most once (a later decision needing more resumes where the count stopped).
// Safe for concurrent use.
type Length struct {
	text     string
	estimate int

	mu  sync.Mutex
	off int // bytes of text counted
	n   int // tokens in text[:off]
	err error
	m   *merger
	// The rest's lower bound (see maxTokenBytes): text[off:scanOff] is scanned into pieces
	// and encodes to at least scanMin tokens; text[scanOff:] is bounded by its bytes alone.
	scanOff int
	scanMin int
}

// NewLength is the length of text; nothing is counted until a decision asks.
func NewLength(text string) *Length {
	return &Length{text: text, estimate: (len(text) + 3) / 4}
}

// Estimate is one token per four bytes of text, rounded up (the seed's prompt-length estimate).
func (l *Length) Estimate() int { return l.estimate }

// Probe collects the boundaries one decision compares the prompt length with.
type Probe struct {
	l      *Length
	bounds []int
	inline [8]int
}

// Probe starts a decision about the prompt's length.
func (l *Length) Probe() Probe { return Probe{l: l} }

// Boundary adds b: the decision differs between a prompt of b-1 tokens and one of b (b ≤ 0
// never does).
func (p *Probe) Boundary(b int) {
	if b <= 0 {
		return
	}
	if p.bounds == nil {
		p.bounds = p.inline[:0]
	}
	for _, x := range p.bounds {
		if x == b {
			return
		}
	}
	p.bounds = append(p.bounds, b)
}

// Tokens returns a length that lies on the same side of every boundary as the prompt's count.
// The prompt is counted only while a boundary lies between the bounds of what is counted plus
// the rest (see maxTokenBytes): a prompt whose estimate is far from every boundary is not
// counted at all, and one far past the boundaries only until they are behind. The length
// returned is the estimate moved into those bounds (the exact count when the whole prompt was
// counted). counted says tokens were merged; it is false when the bounds decided alone (the
// estimate moved into them) or the vocabulary could not be loaded (the estimate).
func (p *Probe) Tokens() (n int, counted bool) {
	lo, hi, counted, err := p.l.countUntil(p.bounds)
	if err != nil {
		return p.l.estimate, false
	}
	return min(max(p.l.estimate, lo), hi), counted
}

// Counted is the exact count when the whole prompt has been counted (complete), else the
// tokens counted so far.
func (l *Length) Counted() (n int, complete bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n, l.off == len(l.text)
}

// countTo counts until the count reaches limit (limit ≤ 0: the whole text) or the text ends,
// and returns the tokens counted.
func (l *Length) countTo(limit int) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.ready(); err != nil {
		return 0, err
	}
	for l.off < len(l.text) && (limit <= 0 || l.n < limit) {
		l.step()
	}
	return l.n, nil
}

// countUntil counts until no boundary lies within the bounds of the count (see
// maxTokenBytes), and returns those bounds.
func (l *Length) countUntil(bounds []int) (lo, hi int, counted bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		rest := len(l.text) - l.off
		lo, hi = l.n+l.scanMin+pieceMin(len(l.text)-l.scanOff), l.n+rest
		open, below := false, false
		for _, b := range bounds {
			if lo < b && b <= hi {
				open = true
				below = below || b <= l.n+rest/4 // the estimate says the count passes b
			}
		}
		if !open {
			return lo, hi, l.off > 0, nil
		}
		if err := l.ready(); err != nil {
			return 0, 0, false, err
		}
		if below && l.scanOff < len(l.text) {
			// Scan ahead, only as far as needed: when the count likely passes a boundary,
			// the pieces' bound shows it without merging. (A count that likely stays under
			// every open boundary can only be shown by merging.)
			for range 64 {
				if l.scanOff == len(l.text) {
					break
				}
				end := piece(l.text, l.scanOff)
				l.scanMin += pieceMin(end - l.scanOff)
				l.scanOff = end
			}
			continue
		}
		// A few pieces between checks: each check is a handful of comparisons.
		for range 16 {
			if l.off == len(l.text) {
				break
			}
			l.step()
		}
	}
}

// ready loads the vocabulary on first use. l.mu is held.
func (l *Length) ready() error {
	if l.err != nil {
		return l.err
	}
	if l.m != nil {
		return nil
	}
	v, err := vocab()
	if err != nil {
		l.err = err
		return err
	}
	l.m = &merger{ranks: v}
	l.text = validUTF8(l.text) // checked once, when a count is first needed
	return nil
}

// step counts the next piece. l.mu is held.
func (l *Length) step() {
	end := piece(l.text, l.off)
	l.n += l.m.count(l.text[l.off:end])
	if l.off < l.scanOff { // pieces from off are the scan's: end ≤ scanOff
		l.scanMin -= pieceMin(end - l.off)
	}
	l.off = end
	if l.scanOff < l.off {
		l.scanOff, l.scanMin = l.off, 0
	}
}

// KnownLength is a length known without counting: a prompt of n token ids. Its estimate, its
// probes and its count are all n.
func KnownLength(n int) *Length {
	return &Length{estimate: n, n: n}
}
