package app

import (
	"errors"
	"net"
	"time"

	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/telemetry"
)

// Passive health's wiring: every scrape is recorded as a probe of its endpoint, and health's
// decisions and the pair-level retries become metrics.

// healthObserver feeds ejections and returns to the metrics.
type healthObserver struct{ m *telemetry.Metrics }

func (o healthObserver) Ejected(ep *pool.Endpoint, reason string, _ time.Duration) {
	o.m.OutlierEjected(ep, reason)
}

func (o healthObserver) Returned(ep *pool.Endpoint, after time.Duration, source string) {
	o.m.OutlierReturned(ep, after, source)
}

func (o healthObserver) EjectionOverflow(ep *pool.Endpoint, reason, overflow string) {
	o.m.OutlierOverflow(ep, reason, overflow)
}

var _ health.Observer = healthObserver{}

// scrapeProbes is the scraper's observer: Tandem's metrics, and each scrape recorded as a
// probe of its endpoint.
type scrapeProbes struct {
	*telemetry.Metrics
	rec *outcome.Recorder
}

// SourceScrape names a metrics scrape in outcome.Probe.Source.
const SourceScrape = "scrape"

// ScrapeProbed implements metrics.ProbeObserver.
func (s scrapeProbes) ScrapeProbed(ep *pool.Endpoint, servingPort bool, took time.Duration, class string, err error) {
	if class == metrics.ErrClassCanceled {
		return
	}
	var ne net.Error
	s.rec.Probe(outcome.Probe{Endpoint: ep.Key(), Source: SourceScrape, Err: err, Took: took, ServingPort: servingPort,
		Refused: class == metrics.ErrClassRefused, Timeout: class == metrics.ErrClassTimeout || (errors.As(err, &ne) && ne.Timeout())})
}

var _ metrics.ProbeObserver = scrapeProbes{}

// PrefillRetry implements extproc.RetryObserver.
func (o *extprocObserver) PrefillRetry(result string) { o.m.PrefillRetry(result) }

var _ extproc.RetryObserver = (*extprocObserver)(nil)

// countFiltered counts a decision that left candidates out for passive health, once per why.
func countFiltered(m *telemetry.Metrics, tr *picker.Trace) {
	if tr == nil || len(tr.Health) == 0 {
		return
	}
	var ejected, recent bool
	for _, state := range tr.Health {
		if state == health.StateRecentFailure {
			recent = true
		} else {
			ejected = true
		}
	}
	if ejected {
		m.OutlierFiltered(health.StateEjected)
	}
	if recent {
		m.OutlierFiltered(health.StateRecentFailure)
	}
}
