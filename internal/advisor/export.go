package advisor

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Published is the advice as exported: Prometheus gauges and a JSON status endpoint, both
// computed from one report that is at most Refresh old (a report costs a few milliseconds;
// several scrapers and readers share it).
type Published struct {
	a    *Advisor
	snap func() *pool.Snapshot

	mu   sync.Mutex
	last Report
	done bool
}

// Refresh is the longest a published report is reused.
const Refresh = 5 * time.Second

// Publish exports a's advice on the pool snap returns.
func (a *Advisor) Publish(snap func() *pool.Snapshot) *Published {
	return &Published{a: a, snap: snap}
}

// Report is the current report, recomputed when the last one is older than Refresh.
func (p *Published) Report() Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.a.o.Clock.Now()
	if !p.done || now.Sub(p.last.At) >= Refresh || now.Before(p.last.At) {
		p.last, p.done = p.a.Advise(p.snap()), true
	}
	return p.last
}

// The gauges.
var (
	descSaturation = prometheus.NewDesc("tandem_stage_saturation",
		"P:D ratio advisor: each stage's load over the load at which it would just meet the TTFT and TPOT objectives for the goodput share of its requests (1: at the objectives; above 1: missing them), by model and stage (prefill, decode, standard).",
		[]string{"model", "stage"}, nil)
	descBinding = prometheus.NewDesc("tandem_stage_binding",
		"P:D ratio advisor: 1 for the model's most saturated stage, 0 for the others.",
		[]string{"model", "stage"}, nil)
	descRecommended = prometheus.NewDesc("tandem_recommended_pods",
		"P:D ratio advisor: the split of the model's current pod count between roles (prefill, decode, standard) predicted to serve the window's traffic at the highest SLO-goodput rate; the current split when none is predicted better.",
		[]string{"model", "role"}, nil)
	descConfidence = prometheus.NewDesc("tandem_advice_confidence",
		"P:D ratio advisor: how much the advice rests on, 0..1 (the window's requests up to 500, halved for each latency fit — prefill, decode step — with fewer than 20 observations).",
		[]string{"model"}, nil)
	descRequests = prometheus.NewDesc("tandem_advice_window_requests",
		"P:D ratio advisor: the completed requests of the model in the advisor's window.",
		[]string{"model"}, nil)
	descCapacity = prometheus.NewDesc("tandem_advice_capacity_requests_per_second",
		"P:D ratio advisor: predicted SLO-goodput capacity for the window's traffic mix of the current and the recommended split.",
		[]string{"model", "split"}, nil)
)

// Describe implements prometheus.Collector.
func (p *Published) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSaturation, descBinding, descRecommended, descConfidence, descRequests, descCapacity} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (p *Published) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, m := range p.Report().Models {
		for _, s := range []struct {
			stage string
			v     float64
			pods  int
		}{{StagePrefill, m.Saturation.Prefill, m.Recommended.Prefill}, {StageDecode, m.Saturation.Decode, m.Recommended.Decode},
			{StageStandard, m.Saturation.Standard, m.Recommended.Standard}} {
			g(descSaturation, s.v, m.Model, s.stage)
			bind := 0.0
			if m.Binding == s.stage {
				bind = 1
			}
			g(descBinding, bind, m.Model, s.stage)
			g(descRecommended, float64(s.pods), m.Model, s.stage)
		}
		g(descConfidence, m.Confidence, m.Model)
		g(descRequests, float64(m.Requests), m.Model)
		g(descCapacity, m.CurrentCapacity, m.Model, "current")
		g(descCapacity, m.RecommendedCapacity, m.Model, "recommended")
	}
}

// ServeHTTP answers GET with the report as JSON.
func (p *Published) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the advice is read with GET", http.StatusMethodNotAllowed)
		return
	}
	b, err := json.MarshalIndent(p.Report(), "", "  ")
	if err != nil {
		http.Error(w, "encoding the advice: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}
