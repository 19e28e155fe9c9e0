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

// The uncounted rest of a text of r bytes holds between r·minTokensPerByte and r tokens: every
// token is at least one byte, and natural text averages well under 16 bytes a token (English about
// 4, runs of repeated words 6, indented code 4 to 5; only a long run of one character packs more).
// A decision stops counting once no boundary lies between those bounds.
const minTokensPerByte = 1.0 / 16

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
// the rest (see minTokensPerByte): a prompt whose estimate is far from every boundary is not
// counted at all, and one far past the boundaries only until they are behind. The length
// returned is the estimate moved into those bounds (the exact count when the whole prompt was
// counted). counted says tokens were counted; it is false, with the estimate, when no boundary
// needed it or the vocabulary could not be loaded.
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
// minTokensPerByte), and returns those bounds.
func (l *Length) countUntil(bounds []int) (lo, hi int, counted bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		rest := len(l.text) - l.off
		lo, hi = l.n+int(float64(rest)*minTokensPerByte), l.n+rest
		open := false
		for _, b := range bounds {
			if lo < b && b <= hi {
				open = true
				break
			}
		}
		if !open {
			return lo, hi, l.m != nil, nil
		}
		if err := l.ready(); err != nil {
			return 0, 0, false, err
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
	l.off = end
}
