package main

import (
	"context"
	"testing"
)

// The side-by-side picks at 128 endpoints as Go benchmarks, for profiling
// (go test -bench . -cpuprofile): the chain, the frozen cascade, pd-predictive.
func benchmarkPick(b *testing.B, frozen bool) {
	benchmarkSetup(b, func(ctx context.Context) setup { return build(ctx, 128, 42, "", frozen) })
}

func benchmarkSetup(b *testing.B, mk func(context.Context) setup) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &runner{s: mk(ctx)}
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
func BenchmarkPickPredictive128(b *testing.B) {
	benchmarkSetup(b, func(ctx context.Context) setup { return buildPredictive(ctx, 128, 42) })
}

// BenchmarkPickPlaced128 is BenchmarkPickChain128 on pods placed on nodes in two zones:
// topology-aware pairing weighs the pairs.
func BenchmarkPickPlaced128(b *testing.B) {
	benchmarkSetup(b, func(ctx context.Context) setup {
		return buildWith(ctx, 128, 42, "", false, buildOpts{placed: true})
	})
}
