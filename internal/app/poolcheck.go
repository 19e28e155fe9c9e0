package app

import (
	"context"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/pool"
)

// checkPool reads every pool snapshot the store publishes, at start-up and on each change, until
// ctx ends: it logs once each the pool's probable mistakes (pool.Lint: a role label typo, a
// roleset with one side, pods the pair-match labels leave unpaired) and parses every pod's
// model.aibrix.ai/config annotation, so a bad one is reported (by the picker's annotation
// reporter) when the pod joins, not at its first request.
func checkPool(ctx context.Context, store *pool.Store, pk *Picker, log logr.Logger) {
	changes := store.Changes()
	said := map[string]bool{}
	for {
		snap := store.Load()
		if snap != nil {
			for _, w := range pool.Lint(snap) {
				if !said[w] {
					if len(said) >= 256 { // pod names change; keep the memory bounded
						clear(said)
					}
					said[w] = true
					log.Info("WARNING: check the pool's pod labels", "problem", w)
				}
			}
			pk.CheckAnnotations(snap.Endpoints)
		}
		select {
		case <-changes:
		case <-ctx.Done():
			return
		}
	}
}

// CheckAnnotations parses the model.aibrix.ai/config annotation of each endpoint not seen with
// its current value yet; problems go to the picker's annotation reporter.
func (p *Picker) CheckAnnotations(endpoints []*pool.Endpoint) {
	p.mu.Lock()
	r := p.resolver
	p.mu.Unlock()
	if r == nil {
		return
	}
	for _, e := range endpoints {
		if e.Annotations[pool.AnnotationConfig] != "" {
			r.Profiles().PodRouting(e, "")
		}
	}
}
