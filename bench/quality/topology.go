package main

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/sim"
)

// Topology: a shape whose pods sit in zones ("<shape>@<n>z") pays for a KV transfer between
// zones crossZoneSlowdown times what it pays within one (the decode pod's link is held that
// much longer), and -check topology runs pd-predictive with and without topology-aware
// pairing on it.

// crossZoneSlowdown: a KV transfer between zones takes this many times as long as within one
// (about 4 GB/s of inter-zone bandwidth per pair against 40 GB/s of RDMA inside a zone).
const crossZoneSlowdown = 10

// zoneName is the zone of the k-th pod of a side (pods of a side alternate over the zones).
func zoneName(k, zones int) string { return fmt.Sprintf("zone-%c", 'a'+k%zones) }

// placeIn labels a pod of a zoned shape with its zone and its own node.
func placeIn(labels map[string]string, name string, k, zones int) {
	if zones > 0 {
		labels[config.LabelZone] = zoneName(k, zones)
		labels[config.LabelHostname] = "node-" + name
	}
}

// transferSeconds is a decode leg's KV transfer from pf into dc on an idle link.
func transferSeconds(p sim.Params, pf, dc *vpod, tokens int) float64 {
	s := sim.TransferSeconds(p, tokens)
	if crossZone(pf.ep, dc.ep) {
		s *= crossZoneSlowdown
	}
	return s
}

// crossZone reports whether two pods of a zoned shape sit in different zones.
func crossZone(a, b *pool.Endpoint) bool {
	za, zb := a.Labels[config.LabelZone], b.Labels[config.LabelZone]
	return za != "" && zb != "" && za != zb
}

// topologyPolicies are pd-predictive as shipped (topology-aware) and with
// TANDEM_TOPOLOGY_LABELS=none (topology-blind).
var topologyPolicies = []policy{
	{name: "pd-predictive", strategy: pd.StrategyPredictive},
	{name: "pd-predictive-blind", strategy: pd.StrategyPredictive, topologyOff: true},
}

// checkTopology runs topology-aware and topology-blind pd-predictive on each -clusters shape
// (each must have zones) at each of -loads × the shape's reference rate, seeds 1..-seeds,
// pools each policy's measured requests per shape, and prints their p99 TTFT, its ratio, the
// share of PD requests paired across zones and the failures (RESULT topology, one line per
// shape). It fails when a request failed or the aware p99 is not below the blind one.
func checkTopology(o *options, w *workload, stdout io.Writer) error {
	var errs []error
	for _, c := range o.clusters {
		if c.zones < 2 {
			return fmt.Errorf("-check topology: shape %s has no zones; give one like 1x4p4d@2z", c.name)
		}
	}
	for _, c := range o.clusters {
		if err := checkTopologyShape(o, w, c, stdout); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func checkTopologyShape(o *options, w *workload, c clusterSpec, stdout io.Writer) error {
	rate := o.checkRate
	if rate == 0 {
		var err error
		if rate, err = capacity(w, c, o); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "check topology: %s on %s (cross-zone KV transfer ×%d), %d requests, loads %v × %.2f req/s, seeds 1..%d\n",
		w.name, c.name, crossZoneSlowdown, len(w.reqs), o.loads, rate, o.seeds)
	type tally struct {
		ttft              []float64
		pd, cross, failed int
	}
	tl := map[string]*tally{}
	for _, p := range topologyPolicies {
		tl[p.name] = &tally{}
	}
	keys := map[string]*pool.Endpoint{}
	for _, e := range c.endpoints(false) {
		keys[e.Key()] = e
	}
	for _, l := range o.loads {
		for seed := uint64(1); seed <= uint64(o.seeds); seed++ {
			for _, p := range topologyPolicies {
				res, err := simulate(w, c, p, runOpts{params: o.params, scrape: o.scrape, seed: seed, rate: l * rate})
				if err != nil {
					return err
				}
				var ttft []float64
				pd, cross, failed := 0, 0, 0
				for i := range res.recs {
					r := &res.recs[i]
					if !r.measured {
						continue
					}
					if r.failed != "" {
						failed++
						continue
					}
					ttft = append(ttft, r.ttft())
					if r.outcome == picker.OutcomePD {
						pd++
						if crossZone(keys[r.prefillPod], keys[r.decodePod]) {
							cross++
						}
					}
				}
				t := tl[p.name]
				t.ttft = append(t.ttft, ttft...)
				t.pd, t.cross, t.failed = t.pd+pd, t.cross+cross, t.failed+failed
				slices.Sort(ttft)
				fmt.Fprintf(stdout, "load %.2f seed %d %-20s p99 TTFT %6.0f ms, cross-zone %5.1f %% of %d PD requests, failures %d\n",
					l, seed, p.name, pct(ttft, 99)*1000, 100*float64(cross)/max(float64(pd), 1), pd, failed)
			}
		}
	}
	aware, blind := tl[topologyPolicies[0].name], tl[topologyPolicies[1].name]
	slices.Sort(aware.ttft)
	slices.Sort(blind.ttft)
	pa, pb := pct(aware.ttft, 99), pct(blind.ttft, 99)
	share := func(t *tally) float64 { return float64(t.cross) / max(float64(t.pd), 1) }
	fmt.Fprintf(stdout, "RESULT topology shape=%s workload=%s p99_ttft_aware_ms=%.0f p99_ttft_blind_ms=%.0f ratio=%.3f cross_zone_aware=%.3f cross_zone_blind=%.3f failures_aware=%d failures_blind=%d\n",
		c.name, w.name, pa*1000, pb*1000, pa/pb, share(aware), share(blind), aware.failed, blind.failed)
	switch {
	case aware.failed+blind.failed > 0:
		return fmt.Errorf("-check topology %s: %d requests failed (aware %d, blind %d): topology-aware pairing must never empty a pool", c.name, aware.failed+blind.failed, aware.failed, blind.failed)
	case !(pa < pb):
		return fmt.Errorf("-check topology %s: topology-aware p99 TTFT %.0f ms is not below topology-blind %.0f ms", c.name, pa*1000, pb*1000)
	}
	return nil
}
