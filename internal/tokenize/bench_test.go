package tokenize

import (
	"os"
	"strings"
	"testing"
)

// benchText is 32 KiB of the repository's own prose (docs/), the kind of text a prompt carries.
func benchText(b *testing.B) string {
	raw, err := os.ReadFile("../../docs/migrate-from-aibrix.md")
	if err != nil {
		b.Fatal(err)
	}
	return strings.Repeat(string(raw), 32<<10/len(raw)+1)[:32<<10]
}

func BenchmarkCount(b *testing.B) {
	text := benchText(b)
	if _, _, err := Count(text, 0); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		_, _, _ = Count(text, 0)
	}
}

func BenchmarkTiktokenGo(b *testing.B) {
	text := benchText(b)
	enc := reference(b)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		_ = enc.EncodeOrdinary(text)
	}
}

// BenchmarkProbeBuckets decides buckets at 1024, 2048 and 4096 tokens (bench/picker's) for
// prose prompts of 1 to 32 KiB, each on a fresh Length as a request does.
func BenchmarkProbeBuckets(b *testing.B) {
	text := benchText(b)
	if err := Load(); err != nil {
		b.Fatal(err)
	}
	var prompts []string
	for n := 1 << 10; n <= 32<<10; n += 1 << 10 {
		prompts = append(prompts, text[:n])
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l := NewLength(prompts[i%len(prompts)])
		p := l.Probe()
		p.Boundary(1024)
		p.Boundary(2048)
		p.Boundary(4096)
		_, _ = p.Tokens()
		i++
	}
}
