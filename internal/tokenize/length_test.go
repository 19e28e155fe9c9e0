package tokenize

import (
	"strings"
	"testing"
)

// TestProbeCountsOnlyNearABoundary: 200 × "hello " is 1200 bytes, an estimate of 300 tokens and
// 201 real ones. A boundary at 250 is within what the prompt could hold, so it is counted and lands
// below it (the estimate would have put it above); a boundary at 5000 is beyond every byte being a
// token, so nothing is counted.
func TestProbeCountsOnlyNearABoundary(t *testing.T) {
	l := NewLength(strings.Repeat("hello ", 200))
	if l.Estimate() != 300 {
		t.Fatalf("estimate %d", l.Estimate())
	}
	far := l.Probe()
	far.Boundary(5000)
	far.Boundary(0) // no boundary: ignored
	if n, counted := far.Tokens(); n != 300 || counted {
		t.Errorf("far boundary: %d (counted %v), want the estimate 300 uncounted", n, counted)
	}
	if n, _ := l.Counted(); n != 0 {
		t.Errorf("a far boundary counted %d tokens", n)
	}
	near := l.Probe()
	near.Boundary(250)
	if n, counted := near.Tokens(); n >= 250 || !counted {
		t.Errorf("near boundary: %d (counted %v), want a counted length below 250 (the prompt is 201)", n, counted)
	}
}

// TestProbeCountsOnlyUntilDecided: a 32 KiB prompt of prose is about 7300 tokens in about as
// many pieces. Against a boundary at 2048 or 3000 the scan into pieces decides alone: nothing is
// merged. A prompt led by 400 "=" rules (two tokens each, one piece each) is counted against a
// boundary 200 under its count only until the rules counted raise the lower bound past it,
// before the prose. A later decision with boundaries at the full count and one past it resumes
// where the count stopped (each token counted once) and can only answer the exact count.
func TestProbeCountsOnlyUntilDecided(t *testing.T) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 800)[:32<<10]
	l := NewLength(text)
	for _, b := range []int{2048, 3000} {
		p := l.Probe()
		p.Boundary(b)
		if n, counted := p.Tokens(); counted || n != l.Estimate() {
			t.Errorf("boundary %d: %d (counted %v), want the estimate %d uncounted", b, n, counted, l.Estimate())
		}
		if got, _ := l.Counted(); got != 0 {
			t.Errorf("boundary %d: merged %d tokens, want none (the pieces decide)", b, got)
		}
	}

	text = strings.Repeat(strings.Repeat("=", 79)+"\n", 400) + text[:16<<10]
	full, _, err := Count(text, 0)
	if err != nil {
		t.Fatal(err)
	}
	l = NewLength(text)
	p := l.Probe()
	p.Boundary(full - 200)
	n, counted := p.Tokens()
	if !counted || n < full-200 {
		t.Errorf("boundary %d: %d (counted %v), want a counted length of at least %d", full-200, n, counted, full-200)
	}
	if got, complete := l.Counted(); complete || got > 600 {
		t.Errorf("boundary %d: counted %d tokens (complete %v) of %d, want to stop within the rules", full-200, got, complete, full)
	}
	q := l.Probe()
	q.Boundary(full)
	q.Boundary(full + 1)
	if n, counted := q.Tokens(); !counted || n != full {
		t.Errorf("resumed: %d (counted %v), want the full count %d (the one length on the right side of both)", n, counted, full)
	}
	if got, complete := l.Counted(); got > full || (complete && got != full) {
		t.Errorf("after resuming: %d (complete %v) of %d: a token counted twice", got, complete, full)
	}
}

// TestCountLimit: Count stops once it reaches the limit and says it did.
func TestCountLimit(t *testing.T) {
	text := strings.Repeat("word ", 1000)
	if n, complete, err := Count(text, 100); err != nil || complete || n < 100 || n > 110 {
		t.Errorf("Count(limit 100) = %d, %v, %v", n, complete, err)
	}
	if n, complete, err := Count(text, 0); err != nil || !complete || n != 1001 { // the last space is its own
		t.Errorf("Count(no limit) = %d, %v, %v", n, complete, err)
	}
}
