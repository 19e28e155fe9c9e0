package picker

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// llm-d's producer and scorer, worked by hand. The prompt is 384 tokens: with blocks of 64
// tokens (blockSizeTokens 16 is raised to llm-d's minimum 64) and maxPrefixTokensToMatch 256,
// 4 blocks are matched. After a pick warms pod a with lruCapacityPerServer 2, a holds the
// first 2 blocks (its most recent): a matches 2/4 = 0.5, b nothing. With matchLengthWeight
// 0.5 and matchLengthScaleTokens 256: length = min(1, 2·64/256) = 0.5, and the score is
// 0.5·0.5² + 0.5·0.5 = 0.375.
func TestApproxPrefixProducerAndScorer(t *testing.T) {
	f := parseFile(t, `
plugins:
- type: approx-prefix-cache-producer
  parameters: {autoTune: false, blockSizeTokens: 16, maxPrefixTokensToMatch: 256, lruCapacityPerServer: 2}
- type: prefix-cache-scorer
- type: prefix-cache-scorer
  name: by-length
  parameters: {matchLengthWeight: 0.5, matchLengthScaleTokens: 256}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: prefix-cache-scorer}]
`)
	deps := NewDeps(nil, config.DefaultPD().PrefixCache)
	h := NewHandle(deps)
	for _, s := range f.Plugins {
		h.Declare(s.Name)
	}
	reg := NewRegistry()
	var plugins []Plugin
	for _, s := range f.Plugins {
		p, err := reg.build(s.Type, s.Name, s.Parameters, h)
		if err != nil {
			t.Fatal(err)
		}
		h.Add(p)
		plugins = append(plugins, p)
	}
	if w := h.Warnings(); len(w) != 1 || !strings.Contains(w[0], "blockSizeTokens=16 is below llm-d's minimum; 64 is used") {
		t.Fatalf("warnings %v", w)
	}
	producer, ratio, byLength := plugins[0].(*ApproxPrefixProducer), plugins[1].(Scorer), plugins[2].(Scorer)
	a, b := ep("a", "", ""), ep("b", "", "")
	prompt := strings.Repeat("0123456789abcdef", 96) // 1536 bytes = 384 tokens
	cycle := func() *Cycle {
		return &Cycle{Req: &request.Request{Model: "m", Prompt: prompt}, Candidates: []*pool.Endpoint{a, b}, State: &CycleState{}}
	}
	c := cycle()
	if m := producer.Match(c); m.BlockTokens != 64 || m.Total() != 4 || m.Blocks(a) != 0 {
		t.Fatalf("cold: block %d, total %d, a %d", m.BlockTokens, m.Total(), m.Blocks(a))
	}
	producer.PostPick(context.Background(), c, &Decision{Destination: []*pool.Endpoint{a}})

	c = cycle()
	if err := producer.Produce(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if m := producer.Match(c); m.Blocks(a) != 2 || m.Blocks(b) != 0 {
		t.Fatalf("after warming a with a bound of 2: a %d, b %d", m.Blocks(a), m.Blocks(b))
	}
	for _, tc := range []struct {
		s    Scorer
		want float64
	}{{ratio, 0.5}, {byLength, 0.375}} {
		out := make([]float64, 2)
		tc.s.Score(context.Background(), c, []*pool.Endpoint{a, b}, out)
		if math.Abs(out[0]-tc.want) > 1e-12 || out[1] != 0 {
			t.Errorf("%s: %v, want [%v 0]", tc.s.Name(), out, tc.want)
		}
	}

	// autoTune: the block size comes from the first candidate's cache_config_info.
	auto, err := reg.New(TypeApproxPrefixCacheProducer, "auto", nil, deps)
	if err != nil {
		t.Fatal(err)
	}
	deps.Metrics.Put(a.Key(), &metrics.Sample{BlockSize: 128})
	if m := auto.(*ApproxPrefixProducer).Match(cycle()); m.BlockTokens != 128 {
		t.Fatalf("autoTune block size %d, want the engine's 128", m.BlockTokens)
	}
}
