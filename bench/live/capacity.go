package main

import (
	"fmt"
	"io"
	"math"
)

// capacityRouters are the routers -capacity searches: Tandem's recommended policy, the simple
// baseline that did best on the default engine (least-request over the whole-request pods) and
// llm-d's EPP.
var capacityRouters = []string{"pd-predictive", "least-request-nopd", "llm-d"}

// goodputTarget is the SLO-goodput threshold: ≥ 90 % of requests within both objectives.
const goodputTarget = 0.9

// capacity is one router's SLO-goodput capacity: the highest load that met goodputTarget, as
// bracketed by the search ([load, above)); above is +Inf when every load tried met it, load 0
// when none did.
type capacity struct {
	router      string
	load, above float64
	rps         float64
	probes      int
}

// capTolerance ends a capacity search: the bracket [load, above) is within 2 % of above.
const capTolerance = 0.02

// capGrowth extends the bracket while no load has failed: loads are fractions of a saturation
// rate, so capacities lie near 1 and a quarter more at a time wastes fewer probes than doubling.
const capGrowth = 1.25

// searchCapacity brackets the capacity from the grid's (load, goodput) pairs, then probes at
// most steps more loads until the bracket is within capTolerance: while no load has failed it
// tries capGrowth × the highest that met the target, while none met it half the lowest that
// failed, and otherwise bisects.
func searchCapacity(grid []float64, steps int, probe func(load float64) (float64, error)) (capacity, error) {
	var c capacity
	lo, hi := 0.0, math.Inf(1)
	if len(grid) < 2 {
		return c, fmt.Errorf("capacity search: no loads measured")
	}
	for i := 0; i+1 < len(grid); i += 2 {
		if grid[i+1] >= goodputTarget {
			lo = max(lo, grid[i])
		} else {
			hi = min(hi, grid[i])
		}
	}
	try := func(l float64) error {
		g, err := probe(l)
		if err != nil {
			return err
		}
		c.probes++
		if g >= goodputTarget {
			lo = max(lo, l)
		} else {
			hi = min(hi, l)
		}
		return nil
	}
	for range steps {
		if !math.IsInf(hi, 1) && hi-lo <= capTolerance*hi {
			break
		}
		mid := (lo + hi) / 2
		switch {
		case math.IsInf(hi, 1):
			mid = capGrowth * lo // still no failing load
		case lo == 0:
			mid = hi / 2
		}
		if err := try(mid); err != nil {
			return c, err
		}
	}
	c.load, c.above = lo, hi
	return c, nil
}

func writeCapacities(w io.Writer, caps []capacity, tpot float64) {
	if len(caps) == 0 {
		return
	}
	fmt.Fprintf(w, "SLO-goodput capacity (≥ %.0f %% of requests within both objectives, TPOT %.0f ms; the highest load that met it, bracketed by the lowest that did not):\n\n", goodputTarget*100, tpot*1000)
	fmt.Fprintln(w, "| router | capacity (load) | capacity (req/s) | lowest failing load | probes beyond the loads |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, c := range caps {
		fmt.Fprintf(w, "| %s | %.3g | %.2f | %.3g | %d |\n", c.router, c.load, c.rps, c.above, c.probes)
	}
	fmt.Fprintln(w)
}

func writeCapacityResults(w io.Writer, caps []capacity) {
	by := map[string]capacity{}
	for _, c := range caps {
		by[c.router] = c
		fmt.Fprintf(w, "RESULT live_capacity_rps_%s=%.4g\n", c.router, c.rps)
	}
	pred, ok := by["pd-predictive"]
	if !ok {
		return
	}
	ratio := func(other capacity) string {
		if other.rps == 0 {
			return "inf"
		}
		return fmt.Sprintf("%.4g", pred.rps/other.rps)
	}
	if b, ok := by["least-request-nopd"]; ok {
		fmt.Fprintf(w, "RESULT live_capacity_ratio_vs_least_request_nopd=%s\n", ratio(b))
	}
	if l, ok := by["llm-d"]; ok {
		fmt.Fprintf(w, "RESULT live_capacity_ratio_vs_llmd=%s\n", ratio(l))
	}
}
