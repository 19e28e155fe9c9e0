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

// TestProbeCountsOnlyUntilDecided: a 32 KiB prompt is about 7300 tokens. Against a boundary at
// 2048 nothing is counted (its rest alone holds at least 32768/16 = 2048 tokens); against 3000 the
// count stops once what is counted plus the rest's minimum passes 3000, a few KiB in; a later
// decision with a boundary at the full count resumes where the count stopped, so each token is
// counted once and the total is the exact count.
func TestProbeCountsOnlyUntilDecided(t *testing.T) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 800)[:32<<10]
	full, _, err := Count(text, 0)
	if err != nil {
		t.Fatal(err)
	}
	l := NewLength(text)
	p := l.Probe()
	p.Boundary(2048)
	if n, counted := p.Tokens(); counted || n != l.Estimate() {
		t.Errorf("boundary 2048: %d (counted %v), want the estimate %d uncounted", n, counted, l.Estimate())
	}
	p = l.Probe()
	p.Boundary(3000)
	n, counted := p.Tokens()
	if !counted || n < 3000 {
		t.Errorf("boundary 3000: %d (counted %v), want a counted length of at least 3000", n, counted)
	}
	if got, complete := l.Counted(); complete || got > 2000 {
		t.Errorf("boundary 3000: counted %d tokens (complete %v) of %d, want to stop early", got, complete, full)
	}
	q := l.Probe()
	q.Boundary(3000)
	q.Boundary(full)
	if n, counted := q.Tokens(); !counted || n != full {
		t.Errorf("resumed: %d (counted %v), want the full count %d", n, counted, full)
	}
	if got, complete := l.Counted(); !complete || got != full {
		t.Errorf("after resuming: %d (complete %v), want %d", got, complete, full)
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
