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
