package picker

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Trace steps of the health filter.
const (
	StepHealthFilter   = "health_filter"     // candidates were left out (Trace.Health says which and why)
	StepHealthReadmits = "health_readmitted" // the request could not be served without recently failed endpoints
)

// maxTracedExclusions bounds Trace.Health.
const maxTracedExclusions = 8

// pickHealthy runs a strategy's pick behind passive health, the one filter every strategy
// sees: ejected endpoints are never candidates; endpoints whose last outcome is a recent
// failure are candidates only when the pick fails without them (503: no pair, no endpoint) —
// failing fast is not idleness, so whatever the policy, a pod that fails in a millisecond does
// not become the least-loaded choice. A 503 says which endpoints outlier detection left out.
func (r *Router) pickHealthy(cands []*pool.Endpoint, pick func([]*pool.Endpoint) (*Decision, error)) (*Decision, error) {
	healthy, usable, excluded := r.health.Partition(cands)
	if len(excluded) == 0 {
		return pick(cands)
	}
	if len(usable) == 0 {
		return nil, apierror.Unavailable("all_ejected",
			"every endpoint this request may reach (%d) is ejected by outlier detection (%s); an ejected endpoint returns once its ejection time has passed and a scrape or probe of it succeeded",
			len(cands), describe(excluded))
	}
	readmitted := false
	var d *Decision
	var err error
	if len(healthy) > 0 {
		d, err = pick(healthy)
	}
	if len(healthy) == 0 || (err != nil && unavailable(err) && len(usable) > len(healthy)) {
		readmitted = true
		d, err = pick(usable)
	}
	if err != nil {
		if !unavailable(err) {
			return nil, err
		}
		ae := *apierror.From(err)
		ae.Message += fmt.Sprintf(" (outlier detection left out %d of %d candidates: %s)", len(excluded), len(cands), describe(excluded))
		return nil, &ae
	}
	if d.Trace == nil {
		d.Trace = &Trace{Candidates: len(cands)}
	}
	d.Trace.Add(StepHealthFilter)
	if readmitted {
		d.Trace.Add(StepHealthReadmits)
	}
	d.Trace.Health = make(map[string]string, min(len(excluded), maxTracedExclusions))
	for _, x := range excluded[:min(len(excluded), maxTracedExclusions)] {
		d.Trace.Health[x.Endpoint.Key()] = state(x)
	}
	return d, nil
}

func unavailable(err error) bool { return apierror.From(err).Status == http.StatusServiceUnavailable }

func state(x health.Exclusion) string {
	if x.Reason != "" {
		return x.State + ":" + x.Reason
	}
	return x.State
}

// describe lists exclusions for an error message, bounded.
func describe(xs []health.Exclusion) string {
	parts := make([]string, 0, min(len(xs), maxTracedExclusions)+1)
	for _, x := range xs[:min(len(xs), maxTracedExclusions)] {
		parts = append(parts, x.Endpoint.Key()+" "+state(x))
	}
	if len(xs) > maxTracedExclusions {
		parts = append(parts, fmt.Sprintf("and %d more", len(xs)-maxTracedExclusions))
	}
	return strings.Join(parts, ", ")
}
