package telemetry

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
)

// waitGauge gathers until the gauge of a pod has the wanted value (or -1: no series), 10 s at most.
// The scraper publishes on its own schedule, so the test re-checks after each scrape it serves.
func waitGauge(t *testing.T, reg *prometheus.Registry, served <-chan struct{}, name, pod string, want float64) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		if gaugeValue(t, reg, name, pod) == want {
			return
		}
		select {
		case <-served:
		case <-deadline.C:
			t.Fatalf("%s{pod_name=%q} = %v, want %v", name, pod, gaugeValue(t, reg, name, pod), want)
		}
	}
}

// TestScraperFeedsTelemetry runs the real scraper against a real server with Metrics as its
// Observer: scraped load becomes tandem_endpoint_* gauges, failures become stale and errors,
// and a pod leaving the pool takes its series with it.
func TestScraperFeedsTelemetry(t *testing.T) {
	var running, failing atomic.Int64
	running.Store(6)
	served := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		defer func() {
			select {
			case served <- struct{}{}:
			default:
			}
		}()
		if failing.Load() == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} %d\n", running.Load())
	}))
	defer srv.Close()
	_, ps, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(ps)

	m, reg := newMetrics(t)
	obs := &signalling{Metrics: m, emptied: make(chan struct{})}
	store := pool.NewStore()
	d := pool.NewEndpoint("ns", "d-0", "127.0.0.1", int32(port), 0,
		map[string]string{pool.LabelRoleName: "decode", pool.LabelRolesetName: "rs"}, nil)
	store.Publish(pool.Info{}, []*pool.Endpoint{d}, true)
	s, err := metrics.NewScraper(store, metrics.NewStore(), metrics.ScrapeOptions{
		Interval: 20 * time.Millisecond, StaleAfter: 200 * time.Millisecond, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	waitGauge(t, reg, served, "tandem_endpoint_running_requests", "d-0", 6)
	waitGauge(t, reg, served, "tandem_scrape_stale", "d-0", 0)

	failing.Store(1)
	waitGauge(t, reg, served, "tandem_scrape_stale", "d-0", 1)
	if n := seriesWith(t, reg, "tandem_endpoint_running_requests", "pod_name", "d-0"); n != 0 {
		t.Errorf("stale endpoint still exports %d running-request series", n)
	}
	if n := seriesWith(t, reg, "tandem_scrape_errors_total", "reason", metrics.ErrClassHTTPStatus); n != 1 {
		t.Errorf("scrape errors with reason http_status: %d series, want 1", n)
	}

	failing.Store(0)
	running.Store(2)
	waitGauge(t, reg, served, "tandem_endpoint_running_requests", "d-0", 2)
	waitGauge(t, reg, served, "tandem_scrape_stale", "d-0", 0)

	store.Publish(pool.Info{}, nil, true)
	select {
	case <-obs.emptied:
	case <-time.After(10 * time.Second):
		t.Fatal("the scraper never saw the empty pool")
	}
	if n := seriesWith(t, reg, "", "pod_name", "d-0"); n != 0 {
		t.Errorf("d-0 left the pool but %d series remain", n)
	}
}

// signalling is Metrics as an Observer that also says when it has seen an empty pool.
type signalling struct {
	*Metrics
	emptied chan struct{}
	once    sync.Once
}

func (o *signalling) PoolChanged(snap *pool.Snapshot) {
	o.Metrics.PoolChanged(snap)
	if len(snap.Endpoints) == 0 {
		o.once.Do(func() { close(o.emptied) })
	}
}
