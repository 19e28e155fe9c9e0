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

// Near bounds, relative to the estimate, where a prompt's true token count can lie:
// between Estimate·lowFactor and every byte a token of its own (4·Estimate). A decision whose
// boundaries all lie outside that band is taken on the estimate without tokenizing.
const (
	// lowFactor: natural text averages well under 16 bytes a token (English about 4, runs of
	// repeated words 6, indented code 4 to 5); only a run of one repeated character packs more.
	lowFactor  = 0.25
	highFactor = 4
)

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
	l    *Length
	near bool
	// top is the largest boundary near the estimate: counting past it tells the decision
	// nothing more.
	top int
}

// Probe starts a decision about the prompt's length.
func (l *Length) Probe() Probe { return Probe{l: l} }

// Boundary adds b: the decision differs between a prompt of b-1 tokens and one of b. It is near
// when the prompt's true count could fall on either side of it given the estimate.
func (p *Probe) Boundary(b int) {
	e := float64(p.l.estimate)
	if fb := float64(b); b > 0 && fb >= e*lowFactor && fb <= e*highFactor+1 {
		p.near = true
		p.top = max(p.top, b)
	}
}

// Tokens returns a length that lies on the same side of every boundary given as the prompt's
// count: the estimate when no boundary is near it; otherwise the count, made only up to the
// largest near boundary (a prompt past it gets max(that boundary, estimate)). counted says the
// count was made; it is false, with the estimate, when no boundary was near or the vocabulary
// could not be loaded.
func (p *Probe) Tokens() (n int, counted bool) {
	if !p.near {
		return p.l.estimate, false
	}
	n, err := p.l.countTo(p.top)
	if err != nil {
		return p.l.estimate, false
	}
	if n >= p.top && !p.l.complete() {
		return max(p.top, p.l.estimate), true
	}
	return n, true
}

func (l *Length) complete() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.off == len(l.text)
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
	if l.err != nil {
		return 0, l.err
	}
	if l.m == nil {
		v, err := vocab()
		if err != nil {
			l.err = err
			return 0, err
		}
		l.m = &merger{ranks: v}
		l.text = validUTF8(l.text) // checked once, when a count is first needed
	}
	for l.off < len(l.text) && (limit <= 0 || l.n < limit) {
		end := piece(l.text, l.off)
		l.n += l.m.count(l.text[l.off:end])
		l.off = end
	}
	if l.off == len(l.text) {
		l.m = &merger{ranks: l.m.ranks} // the buffers are not needed any more
	}
	return l.n, nil
}
