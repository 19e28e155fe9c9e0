package bucketserve_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tandem-epp/tandem/internal/bucketserve"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/telemetry"
)

func series(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	if m.GetGauge() != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}

// The plan is cached for 5 s, recomputed from the decayed traffic after that, and its
// band-max gauges follow the plan; Routed counts requests and tokens per roleset.
func TestPlannerCacheAndMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := telemetry.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	clock := load.NewManualClock(time.Unix(1_700_000_000, 0))
	p := bucketserve.New(clock, m)
	groups := []bucketserve.Group{{Name: "B", Min: 0, Max: bucketserve.Unlimited, Replicas: 1}, {Name: "A", Min: 0, Max: 2047, Replicas: 1}}

	// The first request sees only its own length: 100 tokens, all in the shared range;
	// need A = B = 50 (ties go by name: A first); the 50th token is in bin 53, so the cut is
	// that bin's upper edge, ceil(2^(54/8)) = 108.
	b, ok := p.Band("m", bucketserve.Throughput, 100, groups)
	if !ok || b != (bucketserve.Band{Roleset: "A", Min: 0, Max: 107}) {
		t.Fatalf("first band %v %v", b, ok)
	}
	if g := series(t, reg, "pd_bucket_serve_band_max"); g["A"] != 107 || g["B"] != 2047 {
		t.Fatalf("band max gauges %v", g)
	}
	p.Routed(b, 100)
	p.Routed(b, 50)
	if c := series(t, reg, "pd_bucket_serve_prompt_tokens_total"); c["A"] != 150 {
		t.Fatalf("tokens routed %v", c)
	}
	if c := series(t, reg, "pd_bucket_serve_band_total"); c["A"] != 2 {
		t.Fatalf("bands chosen %v", c)
	}
	// Within 5 s the cached plan stands, however the traffic moves: 4000-token prompts
	// (B only) and 1000-token ones (shared) pile up, 50 each.
	for range 50 {
		clock.Advance(50 * time.Millisecond)
		p.Band("m", bucketserve.Throughput, 4000, groups)
		p.Band("m", bucketserve.Throughput, 1000, groups)
	}
	if got := p.Bands("m", bucketserve.Throughput, groups); len(got) != 2 {
		t.Fatalf("plan changed within its TTL: %v", got)
	}
	// After 5 s it is recomputed: B's exclusive traffic (~200 000 tokens) exceeds its half of
	// the ~250 000, so the whole shared range [0, 2047] goes to A and B's gauge is deleted.
	clock.Advance(bucketserve.PlanTTL)
	b, ok = p.Band("m", bucketserve.Throughput, 4000, groups)
	if ok {
		t.Fatalf("a 4000-token prompt is banded to %v; only B covers it", b)
	}
	if got := p.Bands("m", bucketserve.Throughput, groups); len(got) != 1 || got[0] != (bucketserve.Band{Roleset: "A", Min: 0, Max: 2047}) {
		t.Fatalf("recomputed plan %v", got)
	}
	if g := series(t, reg, "pd_bucket_serve_band_max"); g["A"] != 2047 || len(g) != 1 {
		t.Fatalf("band max gauges after recompute %v, want only A=2047", g)
	}
}

// A model keeps at most 8 plans; concurrent use is safe (-race).
func TestPlannerBoundsAndConcurrency(t *testing.T) {
	p := bucketserve.New(load.NewManualClock(time.Unix(1_700_000_000, 0)), nil)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				groups := []bucketserve.Group{{Name: "A", Max: bucketserve.Unlimited, Replicas: 1},
					{Name: fmt.Sprintf("B%d", (w+i)%12), Max: bucketserve.Unlimited, Replicas: 1 + i%3}}
				p.Band("m", bucketserve.ParseMode([]string{"rps", "throughput", "bogus"}[i%3]), 100+i*37, groups)
			}
		})
	}
	wg.Wait()
	held := 0
	for i := range 12 {
		for r := 1; r <= 3; r++ {
			for _, mode := range []bucketserve.Mode{bucketserve.RPS, bucketserve.Throughput} {
				groups := []bucketserve.Group{{Name: "A", Max: bucketserve.Unlimited, Replicas: 1},
					{Name: fmt.Sprintf("B%d", i), Max: bucketserve.Unlimited, Replicas: r}}
				if p.Bands("m", mode, groups) != nil {
					held++
				}
			}
		}
	}
	if held == 0 || held > bucketserve.MaxPlansPerModel {
		t.Fatalf("%d plans held, want 1..%d", held, bucketserve.MaxPlansPerModel)
	}
	if bucketserve.ParseMode("bogus") != bucketserve.Throughput || bucketserve.ParseMode("rps") != bucketserve.RPS {
		t.Fatal("ParseMode")
	}
}

// Model names come from request bodies, so the planner must not keep a histogram (2.7 KB)
// and plans for every name it ever saw: a model not routed for ModelIdleAfter (10 min, 20
// half-lives: its traffic has decayed to 2^-20 ≈ 1e-6 of what it was) is forgotten, with
// the gauges only its plans held, at the next request of any model. Worked by hand: model
// "x" routes one 100-token prompt over rolesets XA [0, 2047] and XB [0, ∞) → bands
// XA [0, 107], XB [108, 2047] (as in TestPlannerCacheAndMetrics); then, after the idle
// time, one request of model "y" (rolesets YA, YB).
func TestPlannerForgetsIdleModels(t *testing.T) {
	cases := []struct {
		idle time.Duration
		kept bool
	}{
		{bucketserve.ModelIdleAfter - time.Second, true},
		{bucketserve.ModelIdleAfter, false},
	}
	for _, tc := range cases {
		reg := prometheus.NewRegistry()
		m, err := telemetry.New(reg)
		if err != nil {
			t.Fatal(err)
		}
		clock := load.NewManualClock(time.Unix(1_700_000_000, 0))
		p := bucketserve.New(clock, m)
		xs := []bucketserve.Group{{Name: "XA", Max: 2047, Replicas: 1}, {Name: "XB", Max: bucketserve.Unlimited, Replicas: 1}}
		ys := []bucketserve.Group{{Name: "YA", Max: 2047, Replicas: 1}, {Name: "YB", Max: bucketserve.Unlimited, Replicas: 1}}
		if b, ok := p.Band("x", bucketserve.Throughput, 100, xs); !ok || b.Roleset != "XA" || b.Max != 107 {
			t.Fatalf("idle %v: model x band %v %v, want XA [0, 107]", tc.idle, b, ok)
		}
		clock.Advance(tc.idle)
		p.Band("y", bucketserve.Throughput, 100, ys)
		held := p.Bands("x", bucketserve.Throughput, xs) != nil
		g := series(t, reg, "pd_bucket_serve_band_max")
		_, gauge := g["XA"]
		if held != tc.kept || gauge != tc.kept {
			t.Errorf("idle %v: model x plan held %v, XA gauge present %v; want both %v (gauges %v)", tc.idle, held, gauge, tc.kept, g)
		}
		if g["YA"] != 107 {
			t.Errorf("idle %v: model y's gauges %v, want YA=107", tc.idle, g)
		}
	}
}
