package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// predictionFamily is Tandem's histogram of observed ÷ predicted TTFT, by route kind: how well
// a predictive policy's latency models fit an engine Tandem did not write.
const predictionFamily = "tandem_ttft_prediction_ratio"

// ratioHist is one route kind's cumulative prediction-ratio histogram: bucket upper bounds
// and the observations at or below each (the last bound +Inf).
type ratioHist struct {
	bounds []float64
	counts []float64
}

// predictionRatios reads the EPP's prediction-ratio histograms from its metrics endpoint, by
// route kind (none: the router predicts nothing).
func predictionRatios(ctx context.Context, metricsURL string) (map[string]ratioHist, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", metricsURL, resp.Status)
	}
	return parseRatios(resp.Body)
}

func parseRatios(r io.Reader) (map[string]ratioHist, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", predictionFamily, err)
	}
	out := map[string]ratioHist{}
	f := fams[predictionFamily]
	if f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
		return out, nil
	}
	for _, m := range f.GetMetric() {
		kind := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "kind" {
				kind = l.GetValue()
			}
		}
		var h ratioHist
		for _, b := range m.GetHistogram().GetBucket() {
			h.bounds = append(h.bounds, b.GetUpperBound())
			h.counts = append(h.counts, float64(b.GetCumulativeCount()))
		}
		if len(h.bounds) == 0 || !math.IsInf(h.bounds[len(h.bounds)-1], 1) {
			h.bounds = append(h.bounds, math.Inf(1))
			h.counts = append(h.counts, float64(m.GetHistogram().GetSampleCount()))
		}
		out[kind] = h
	}
	return out, nil
}

// minus is what h gained since before (a run's own observations; before may be empty), and
// whether that is known: not when the buckets differ or a count went down (the EPP restarted).
func (h ratioHist) minus(before ratioHist) (ratioHist, bool) {
	if len(before.counts) == 0 {
		return h, true
	}
	if !slices.Equal(h.bounds, before.bounds) || len(before.counts) != len(h.counts) {
		return ratioHist{}, false
	}
	d := ratioHist{bounds: h.bounds, counts: slices.Clone(h.counts)}
	for i := range d.counts {
		if d.counts[i] -= before.counts[i]; d.counts[i] < 0 {
			return ratioHist{}, false
		}
	}
	return d, true
}

// add sums two histograms of the same buckets (repetitions of one cell); one of other buckets
// is left out, and said so.
func (h ratioHist) add(o ratioHist) (ratioHist, bool) {
	if len(h.bounds) == 0 {
		return ratioHist{bounds: o.bounds, counts: slices.Clone(o.counts)}, true
	}
	if len(o.bounds) == 0 {
		return h, true
	}
	if !slices.Equal(h.bounds, o.bounds) || len(o.counts) != len(h.counts) {
		return h, false
	}
	d := ratioHist{bounds: h.bounds, counts: slices.Clone(h.counts)}
	for i := range d.counts {
		d.counts[i] += o.counts[i]
	}
	return d, true
}

func (h ratioHist) n() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// quantile is the q-quantile of the ratios, interpolated linearly in log space inside its
// bucket (the buckets grow geometrically); NaN when h holds nothing. A quantile in the lowest
// bucket is its bound, in the +Inf bucket the highest finite bound.
func (h ratioHist) quantile(q float64) float64 {
	n := h.n()
	if !(n > 0) {
		return math.NaN()
	}
	rank := q * n
	prevBound, prevCount := 0.0, 0.0
	for i, c := range h.counts {
		if c >= rank && c > prevCount {
			b := h.bounds[i]
			switch {
			case math.IsInf(b, 1):
				return prevBound
			case prevBound <= 0:
				return b
			}
			frac := (rank - prevCount) / (c - prevCount)
			return math.Exp(math.Log(prevBound) + frac*(math.Log(b)-math.Log(prevBound)))
		}
		prevBound, prevCount = h.bounds[i], c
	}
	return prevBound
}

// writePredictions prints how well each predicting router's TTFT predictions held, per load
// and route kind (nothing when none predicted).
func writePredictions(w io.Writer, cells []cell) {
	header := false
	for _, c := range cells {
		for _, kind := range slices.Sorted(maps.Keys(c.s.pred)) {
			h := c.s.pred[kind]
			if h.n() == 0 {
				continue
			}
			if !header {
				fmt.Fprintln(w, "Observed ÷ predicted TTFT (Tandem's `tandem_ttft_prediction_ratio`, every request of the runs; 1 is exact, below 1 the prediction was too high):")
				fmt.Fprintln(w)
				fmt.Fprintln(w, "| load | router | route kind | requests | p10 | p50 | p90 |")
				fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
				header = true
			}
			fmt.Fprintf(w, "| %.2g | %s | %s | %.0f | %.2f | %.2f | %.2f |\n", c.load, c.router, kind, h.n(),
				h.quantile(0.1), h.quantile(0.5), h.quantile(0.9))
		}
	}
	if header {
		fmt.Fprintln(w)
	}
}

// readPredictions is predictionRatios at url, or none for a router without one (llm-d, the
// bench's round-robin).
func readPredictions(ctx context.Context, url string) (map[string]ratioHist, error) {
	if url == "" {
		return nil, nil
	}
	return predictionRatios(ctx, url)
}
