package app

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

// disaggregationWarnings says why the complete prefill/decode rolesets of snap (and its pods
// with roles but no roleset, as llm-d labels them) cannot
// disaggregate with these settings; nil when they can (or the pool has none). Each warning
// names the pods and the setting to change. Per-profile routingConfig.handoff overrides are not
// seen here: a warning about the gateway setting may not hold for a profile that overrides it.
func disaggregationWarnings(snap *pool.Snapshot, gw config.Gateway, gatewayClient string) []string {
	// Pods without a roleset form one group per revision: llm-d's pools have none, and its
	// disagg-profile-handler pairs any of their prefill pods with any decode pod.
	var decode []*pool.Endpoint
	for _, g := range snap.Rolesets() {
		if len(g.Prefill) > 0 {
			decode = append(decode, g.Decode...)
		}
	}
	if len(decode) == 0 {
		return nil
	}
	var out []string
	if gatewayClient == config.ClientDestinationOnly {
		out = append(out, fmt.Sprintf("--gateway-client=%s: the gateway applies only the destination header, so the %d decode pod(s) of complete rolesets "+
			"serve PD requests whole (no prefill leg) and the prefill pods stay idle; put the pool behind a gateway that applies the EPP's mutations to disaggregate",
			config.ClientDestinationOnly, len(decode)))
	}
	if gw.PD.Handoff == config.HandoffSidecar {
		var bare []string
		for _, e := range decode {
			if !e.RoutingSidecar() {
				bare = append(bare, e.Namespace+"/"+e.Name)
			}
		}
		slices.Sort(bare)
		bare = slices.Compact(bare)
		if len(bare) > 0 {
			out = append(out, fmt.Sprintf("TANDEM_PD_HANDOFF=sidecar, but decode pod(s) %s declare no routing sidecar (no %s label): unless a proxy in front "+
				"of them runs the prefill leg from the x-prefiller-host-port header, they compute every prompt themselves and the prefill pods idle; "+
				"set TANDEM_PD_HANDOFF=auto (the default) or epp to have Tandem run the prefill leg", strings.Join(bare, ", "), pool.LabelLLMDRole))
		}
	}
	return out
}

// warnDisaggregation logs, once each, the disaggregationWarnings of every pool snapshot the
// store publishes, until ctx ends: a PD pool configured so that it cannot disaggregate is said
// at start-up (the first snapshot) and whenever the pool changes into one.
func warnDisaggregation(ctx context.Context, store *pool.Store, gw config.Gateway, gatewayClient string, log logr.Logger) {
	changes := store.Changes()
	said := map[string]bool{}
	for {
		for _, w := range disaggregationWarnings(store.Load(), gw, gatewayClient) {
			if !said[w] {
				if len(said) >= 64 { // pod names change; keep the memory bounded
					clear(said)
				}
				said[w] = true
				log.Info("WARNING: this prefill/decode pool cannot disaggregate", "reason", w)
			}
		}
		select {
		case <-changes:
		case <-ctx.Done():
			return
		}
	}
}
