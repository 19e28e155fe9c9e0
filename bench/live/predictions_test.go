package main

import (
	"math"
	"strings"
	"testing"
)

func TestPredictionRatiosFromTheMetricsPage(t *testing.T) {
	page := `# HELP tandem_ttft_prediction_ratio x
# TYPE tandem_ttft_prediction_ratio histogram
tandem_ttft_prediction_ratio_bucket{kind="pd",le="0.5"} 10
tandem_ttft_prediction_ratio_bucket{kind="pd",le="1"} 50
tandem_ttft_prediction_ratio_bucket{kind="pd",le="2"} 90
tandem_ttft_prediction_ratio_bucket{kind="pd",le="+Inf"} 100
tandem_ttft_prediction_ratio_sum{kind="pd"} 100
tandem_ttft_prediction_ratio_count{kind="pd"} 100
`
	got, err := parseRatios(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	h := got["pd"]
	if h.n() != 100 {
		t.Fatalf("n = %v, want 100", h.n())
	}
	// the median is the 40th of the 40 ratios in (0.5, 1]: 1; p30 is halfway, in log space
	if q := h.quantile(0.5); math.Abs(q-1) > 1e-9 {
		t.Errorf("p50 = %v, want 1", q)
	}
	if q := h.quantile(0.3); math.Abs(q-math.Sqrt(0.5)) > 1e-9 {
		t.Errorf("p30 = %v, want √0.5", q)
	}
	if q := h.quantile(0.05); q != 0.5 {
		t.Errorf("p5 = %v, want the lowest bound 0.5", q)
	}
	if q := h.quantile(0.99); q != 2 {
		t.Errorf("p99 = %v, want the highest finite bound 2", q)
	}
	// a run's share: what the histogram gained since before
	before := ratioHist{bounds: h.bounds, counts: []float64{10, 10, 10, 10}}
	if d, ok := h.minus(before); !ok || d.n() != 90 || !(d.quantile(0.5) > 1 && d.quantile(0.5) < 2) {
		t.Errorf("minus: %v n %v p50 %v, want 90 and a median in (1, 2) (0, 40, 80, 90 at or below 0.5, 1, 2, +Inf)", ok, d.n(), d.quantile(0.5))
	}
	if _, ok := before.minus(h); ok {
		t.Error("minus of a histogram that went back (a restarted EPP) should not be known")
	}
	if _, ok := h.minus(ratioHist{bounds: []float64{1, math.Inf(1)}, counts: []float64{1, 1}}); ok {
		t.Error("minus across other buckets should not be known")
	}
	if s, ok := h.add(h); !ok || s.n() != 200 {
		t.Errorf("add: %v n %v, want 200", ok, s.n())
	}
	if got, err := parseRatios(strings.NewReader("other_metric 1\n")); err != nil || len(got) != 0 {
		t.Errorf("a page without the histogram: %v, %v; want none", got, err)
	}
	if !math.IsNaN((ratioHist{}).quantile(0.5)) {
		t.Error("an empty histogram's quantile should be NaN")
	}
}
