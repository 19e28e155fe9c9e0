package health

import (
	"context"
	"errors"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/tandem-epp/tandem/internal/outcome"
)

// ProbePath is what the health probe asks an ejected endpoint for on its serving port: vLLM,
// SGLang and TensorRT-LLM all answer 200 there once they serve.
const ProbePath = "/health"

// SourceHealthProbe names the detector's own probe in outcome.Probe.Source.
const SourceHealthProbe = "health_probe"

// Run keeps the detector current until ctx ends: every interval it probes the ejected
// endpoints whose ejection time has passed (a scrape that succeeds returns them sooner), lets
// go of failures older than the recent-failure window, and forgets endpoints that left the pool.
// Disabled, it only waits for ctx.
func (d *Detector) Run(ctx context.Context) {
	if !d.Enabled() {
		<-ctx.Done() // nothing to do, but a component of the app runs until the end
		return
	}
	changes := d.store.Changes()
	tick := time.NewTicker(d.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
			d.prune()
		case <-tick.C:
			d.sweep(ctx)
		}
	}
}

// sweep probes what is due and clears stale failures.
func (d *Detector) sweep(ctx context.Context) {
	now := d.clock.Now()
	snap := d.store.Load()
	var due []*endpoint
	d.mu.Lock()
	for _, st := range *d.states.Load() {
		if st.ejected.Load() {
			if !now.Before(st.until) && !st.probing {
				st.probing = true
				due = append(due, st)
			}
			continue
		}
		if u := st.demotedUntil.Load(); u != 0 && !d.recent(st, now) {
			st.demotedUntil.Store(0)
			d.retroubleLocked(st)
		}
	}
	d.mu.Unlock()
	for _, st := range due {
		ep := findEndpoint(snap, st.key)
		if ep == nil {
			d.mu.Lock()
			st.probing = false
			d.mu.Unlock()
			continue
		}
		go func() {
			p := d.probe(ctx, st.key, "http://"+ep.HostPort()+ProbePath)
			d.mu.Lock()
			st.probing = false
			d.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			if d.rec != nil {
				d.rec.Probe(p)
			} else {
				p.At = d.clock.Now()
				d.Observe(&outcome.Event{Phase: outcome.PhaseProbe, Probe: &p})
			}
		}()
	}
}

// probe asks url once; a 2xx answer is a success.
func (d *Detector) probe(ctx context.Context, key, url string) outcome.Probe {
	p := outcome.Probe{Endpoint: key, Source: SourceHealthProbe, ServingPort: true}
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err == nil {
		var resp *http.Response
		if resp, err = d.client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode < 200 || resp.StatusCode > 299 {
				err = errors.New("health probe answered " + resp.Status)
			}
		}
	}
	p.Took, p.Err = time.Since(start), err
	p.Refused = errors.Is(err, syscall.ECONNREFUSED)
	var ne net.Error
	p.Timeout = errors.As(err, &ne) && ne.Timeout()
	return p
}

// prune forgets the endpoints that left the pool.
func (d *Detector) prune() {
	snap := d.store.Load()
	d.mu.Lock()
	defer d.mu.Unlock()
	m := *d.states.Load()
	var gone []*endpoint
	for k, st := range m {
		if findEndpoint(snap, k) == nil {
			gone = append(gone, st)
		}
	}
	if len(gone) == 0 {
		return
	}
	next := make(map[string]*endpoint, len(m))
	for k, v := range m {
		next[k] = v
	}
	for _, st := range gone {
		delete(next, st.key)
		if st.troubled {
			st.troubled = false
			d.troubled.Add(-1)
		}
	}
	d.states.Store(&next)
}
