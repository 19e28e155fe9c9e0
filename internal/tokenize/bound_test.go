package tokenize

import (
	"strings"
	"testing"
)

// TestProbeSideMatchesFullCount: whatever the text, a probe's length lies on the same side of
// every boundary as the whole prompt's count. Prompts carry long runs that pack far more than 16
// bytes into a token: "=" rules 79 wide (40 bytes a token), column-padded tool output and deeply
// indented code (about 17), runs of spaces (128, cl100k's longest token). Each boundary is tried
// on a fresh Length (nothing counted yet) and on one a nearer boundary already counted part of.
func TestProbeSideMatchesFullCount(t *testing.T) {
	texts := []string{
		strings.Repeat(strings.Repeat("=", 79)+"\n", 400),
		strings.Repeat("Summarise the log below.\n", 4) + strings.Repeat(strings.Repeat("-", 79)+"\n", 400),
		strings.Repeat("abc"+strings.Repeat(" ", 60)+"def\n", 400),
		strings.Repeat("\n"+strings.Repeat(" ", 48)+"x", 400),
		strings.Repeat(" ", 20000) + "x",
		strings.Repeat("The quick brown fox jumps over the lazy dog. ", 800),
	}
	texts = append(texts, corpus(t)[:40]...)
	for _, text := range texts {
		full, _, err := Count(text, 0)
		if err != nil {
			t.Fatal(err)
		}
		est := (len(text) + 3) / 4
		bounds := []int{full - 1, full, full + 1, full / 2, full * 2, est, est / 2, len(text) / 16, len(text)/16 + 1, len(text) / 128}
		for _, b := range bounds {
			for _, first := range append([]int{0}, bounds...) {
				l := NewLength(text)
				if first > 0 {
					p := l.Probe()
					p.Boundary(first)
					p.Tokens()
				}
				p := l.Probe()
				p.Boundary(b)
				if n, _ := p.Tokens(); b > 0 && (n >= b) != (full >= b) {
					t.Errorf("%.40q (%d bytes, %d tokens), boundary %d after %d: length %d is on the other side", text, len(text), full, b, first, n)
				}
			}
		}
	}
}

// TestLongestToken: the bounds assume no cl100k_base token is longer than maxTokenBytes.
func TestLongestToken(t *testing.T) {
	v, err := vocab()
	if err != nil {
		t.Fatal(err)
	}
	for tok := range v.long {
		if len(tok) > maxTokenBytes {
			t.Fatalf("token %q is %d bytes, over maxTokenBytes %d", tok, len(tok), maxTokenBytes)
		}
	}
}
