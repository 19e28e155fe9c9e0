package latency

import (
	"testing"

	"github.com/tandem-epp/tandem/internal/outcome"
)

// BenchmarkResponseChunk is the cost of one response body chunk after the first, as the
// ext_proc server reports it: the outcome event and the models' stream-progress bookkeeping.
// "recorder-only" is the same chunk with no reader subscribed, so the difference is what the
// models add per chunk. go test -run - -bench ResponseChunk ./internal/latency/
func BenchmarkResponseChunk(b *testing.B) {
	for _, withModels := range []bool{false, true} {
		name := "recorder-only"
		if withModels {
			name = "with-models"
		}
		b.Run(name, func(b *testing.B) {
			r := newRig(Options{})
			if !withModels {
				r.rec = outcome.NewRecorder(r.clock)
			}
			trs := make([]*outcome.Tracker, 64) // 64 streams open on 8 pods
			for i := range trs {
				trs[i] = r.rec.Start(outcome.KindWhole, "", "ns/pod-"+string(rune('a'+i%8))+":8000", 1000)
				trs[i].Response(200, "")
				trs[i].Chunk(64) // the first byte
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				trs[i%len(trs)].Chunk(64)
			}
		})
	}
}
