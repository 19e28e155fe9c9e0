package main

import (
	"context"
	"testing"
)

// The side-by-side pick at 128 endpoints as Go benchmarks, for profiling
// (go test -bench . -cpuprofile): the chain, and the frozen cascade.
func benchmarkPick(b *testing.B, frozen bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &runner{s: build(ctx, 128, 42, "", frozen)}
	for range 1000 {
		r.pick(ctx)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r.pick(ctx)
	}
}

func BenchmarkPickChain128(b *testing.B)   { benchmarkPick(b, false) }
func BenchmarkPickCascade128(b *testing.B) { benchmarkPick(b, true) }
