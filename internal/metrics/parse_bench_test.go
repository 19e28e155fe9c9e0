package metrics

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

// BenchmarkParse measures decoding and extracting the realistic vLLM V1 pages.
func BenchmarkParse(b *testing.B) {
	for _, file := range []string{"vllm_v1.prom", "vllm_v1_dp2.prom"} {
		b.Run(file, func(b *testing.B) {
			page, err := os.ReadFile(filepath.Join("testdata", file))
			if err != nil {
				b.Fatal(err)
			}
			s, err := NewScraper(pool.NewStore(), NewStore(), ScrapeOptions{})
			if err != nil {
				b.Fatal(err)
			}
			m, want := s.dialect[pool.EngineVLLM], s.want[pool.EngineVLLM]
			b.SetBytes(int64(len(page)))
			b.ReportAllocs()
			for b.Loop() {
				fams, err := decodeFamilies(bytes.NewReader(page), textCT, want)
				if err != nil {
					b.Fatal(err)
				}
				extract(fams, m, time.Time{})
			}
		})
	}
}

// BenchmarkParseOpenMetrics measures the OpenMetrics path (used only when a server insists).
func BenchmarkParseOpenMetrics(b *testing.B) {
	page, err := os.ReadFile(filepath.Join("testdata", "vllm_v1.openmetrics"))
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewScraper(pool.NewStore(), NewStore(), ScrapeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	want := s.want[pool.EngineVLLM]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeFamilies(bytes.NewReader(page), "application/openmetrics-text; version=1.0.0", want); err != nil {
			b.Fatal(err)
		}
	}
}
