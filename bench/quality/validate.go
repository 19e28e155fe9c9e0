package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/sim"
)

// Validation: the same requests on the same pods, once through the virtual-time engine and
// once through internal/sim's real HTTP servers on 127.0.0.1 at a small time scale. Pods:
// one prefill, one vLLM decode pod with the routing sidecar (it runs the prefill leg against
// x-prefiller-host-port, then decodes), one standard pod. Requests alternate: even ones whole
// on the standard pod, odd ones as a PD pair. Routing is fixed, so only the engine models differ.

const (
	valRequests  = 60
	valTimeScale = 0.5 // default wall = model × 0.5 (-validate-scale)
)

// valChecks are the two checks: a light one on the Azure conv trace (long answers), and the
// Azure code trace (long prompts) at a rate that keeps the standard pod prefilling a good
// part of the time, so prefill–decode interference acts. Arrivals are Poisson at the rate.
var valChecks = []struct {
	workload string
	rate     float64 // requests per model second
}{{"conv", 2}, {"code", 20}}

type validation struct {
	n                    int
	workload             string
	rate                 float64
	ttftMAE, e2eMAE      float64 // mean absolute error, model seconds
	ttftRel, e2eRel      float64 // mean |real−virtual| ÷ real
	virtP50, realP50     float64 // TTFT
	virtP99, realP99     float64
	virtE2E99, realE2E99 float64
	// E2E mean |real−virtual| ÷ real per path: [0] whole on the standard pod (where
	// prefill–decode interference acts), [1] PD pair.
	e2eRelPath [2]float64
	scale      float64
	// share of the virtual run's iterations on the standard pod that carried prefill and
	// decode work together (the prefill pod decodes nothing, the decode pod prefills nothing)
	stalledShare float64
	wall         time.Duration
}

// fixedScheduler routes request i (x-request-id) as validation says.
type fixedScheduler struct {
	prefill, decode, standard *pool.Endpoint
}

func (f *fixedScheduler) Schedule(_ context.Context, req *request.Request, _ *pool.Snapshot, _ []*pool.Endpoint) (*picker.Decision, error) {
	i, _ := strconv.Atoi(req.ID)
	if i%2 == 0 {
		return &picker.Decision{Outcome: picker.OutcomeCombined, Destination: []*pool.Endpoint{f.standard}}, nil
	}
	return &picker.Decision{Outcome: picker.OutcomePD, Destination: []*pool.Endpoint{f.decode}, Prefill: []*pool.Endpoint{f.prefill}}, nil
}

// validateEngine runs the check at each of valRates.
func validateEngine(o *options) ([]*validation, error) {
	var out []*validation
	for _, c := range valChecks {
		v, err := validateAt(o, c.workload, c.rate)
		if err != nil {
			return nil, fmt.Errorf("%s at %g req/s: %w", c.workload, c.rate, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func validateAt(o *options, workload string, valRate float64) (*validation, error) {
	dataDir, err := findData(o.dataDir)
	if err != nil {
		return nil, err
	}
	w, err := loadWorkload(dataDir, workload, valRequests, o.params, o.seed)
	if err != nil {
		return nil, err
	}
	scale := o.valScale
	if scale <= 0 {
		scale = valTimeScale
	}
	arrivals := w.arrivals(valRate, o.seed)
	c := clusterSpec{name: "1x1p1d+1s", rolesets: 1, prefill: 1, decode: 1, standard: 1}
	eps := c.endpoints(false)
	byName := map[string]*pool.Endpoint{}
	for _, e := range eps {
		byName[e.Name] = e
	}
	fs := &fixedScheduler{prefill: byName["rs0-prefill-0"], decode: byName["rs0-decode-0"], standard: byName["standard-0"]}
	virt, err := simulate(w, c, policy{name: "fixed"}, runOpts{params: o.params, scrape: o.scrape, seed: o.seed, rate: valRate, sched: fs})
	if err != nil {
		return nil, err
	}

	// The real-time run.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := func(name, role string, sidecar bool) (*sim.Server, error) {
		return sim.Start(ctx, sim.PodConfig{Name: name, Engine: "vllm", Role: role, Addr: "127.0.0.1:0", KVAddr: "127.0.0.1:0",
			Model: modelName, Params: o.params, TimeScale: scale, RoutingSidecar: sidecar})
	}
	pf, err := start("prefill", "prefill", false)
	if err != nil {
		return nil, err
	}
	defer pf.Close()
	dc, err := start("decode", "decode", true)
	if err != nil {
		return nil, err
	}
	defer dc.Close()
	st, err := start("standard", "", false)
	if err != nil {
		return nil, err
	}
	defer st.Close()

	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	type meas struct {
		ttft, e2e float64
		err       error
	}
	got := make([]meas, len(w.reqs))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range w.reqs {
		q := &w.reqs[i]
		at := t0.Add(sim.Wall(arrivals[q.id], scale))
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(at)) // pacing the load generator to the trace, not synchronisation
			url, hdr := st.URL(), ""
			if q.id%2 == 1 {
				url, hdr = dc.URL(), pf.HostPort()
			}
			sent := time.Now()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(q.body))
			req.Header.Set("Content-Type", "application/json")
			if hdr != "" {
				req.Header.Set(sim.HeaderPrefiller, hdr)
			}
			resp, err := client.Do(req)
			if err != nil {
				got[q.id].err = err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				got[q.id].err = fmt.Errorf("request %d: status %d", q.id, resp.StatusCode)
				return
			}
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			var first time.Duration
			tokens := 0
			for sc.Scan() {
				line := sc.Text()
				if !strings.HasPrefix(line, "data: ") || line == "data: [DONE]" {
					continue
				}
				if strings.Contains(line, `"text"`) {
					if tokens == 0 {
						first = time.Since(sent)
					}
					tokens++
				}
			}
			if tokens != q.out {
				got[q.id].err = fmt.Errorf("request %d: %d tokens streamed, want %d", q.id, tokens, q.out)
				return
			}
			got[q.id].ttft = first.Seconds() / scale
			got[q.id].e2e = time.Since(sent).Seconds() / scale
		}()
	}
	wg.Wait()
	v := &validation{n: len(w.reqs), workload: workload, rate: valRate, wall: time.Since(t0), scale: scale, stalledShare: float64(virt.stdMixed) / float64(max(1, virt.stdIterations))}
	var pathN [2]float64
	var vt, rt, ve, re []float64
	for i, g := range got {
		if g.err != nil {
			return nil, g.err
		}
		r := virt.recs[i]
		v.ttftMAE += math.Abs(g.ttft - r.ttft())
		v.e2eMAE += math.Abs(g.e2e - r.e2e())
		v.ttftRel += math.Abs(g.ttft-r.ttft()) / g.ttft
		v.e2eRel += math.Abs(g.e2e-r.e2e()) / g.e2e
		v.e2eRelPath[i%2] += math.Abs(g.e2e-r.e2e()) / g.e2e
		pathN[i%2]++
		vt, rt, ve, re = append(vt, r.ttft()), append(rt, g.ttft), append(ve, r.e2e()), append(re, g.e2e)
	}
	n := float64(len(got))
	v.ttftMAE, v.e2eMAE, v.ttftRel, v.e2eRel = v.ttftMAE/n, v.e2eMAE/n, v.ttftRel/n, v.e2eRel/n
	for k := range pathN {
		v.e2eRelPath[k] /= max(1, pathN[k])
	}
	for _, xs := range [][]float64{vt, rt, ve, re} {
		slices.Sort(xs)
	}
	v.virtP50, v.realP50, v.virtP99, v.realP99 = pct(vt, 50), pct(rt, 50), pct(vt, 99), pct(rt, 99)
	v.virtE2E99, v.realE2E99 = pct(ve, 99), pct(re, 99)
	return v, nil
}

func (v *validation) text() string {
	return fmt.Sprintf("validation vs internal/sim (%d %s requests at %g req/s, time scale %g, %s wall): TTFT p50 virtual %s ms / real %s ms, p99 %s / %s ms, "+
		"E2E p99 %s / %s ms; mean |Δ| TTFT %s ms (%.1f%%), E2E %s ms (%.1f%%; standard pod %.1f%%, PD pair %.1f%%); %.1f%% of the standard pod's iterations mixed prefill and decode\n",
		v.n, v.workload, v.rate, v.scale, v.wall.Round(time.Millisecond), ms(v.virtP50), ms(v.realP50), ms(v.virtP99), ms(v.realP99),
		ms(v.virtE2E99), ms(v.realE2E99), ms(v.ttftMAE), v.ttftRel*100, ms(v.e2eMAE), v.e2eRel*100, v.e2eRelPath[0]*100, v.e2eRelPath[1]*100, v.stalledShare*100)
}

func (v *validation) markdown() string {
	return fmt.Sprintf("### Azure %s at %g req/s\n\n"+
		"The first %d requests of the Azure %s trace at %.0f req/s, on one prefill pod, one vLLM decode pod running the routing sidecar and one standard pod; "+
		"even requests whole on the standard pod, odd ones as a PD pair (fixed routing, so only the engines differ). "+
		"Real: internal/sim HTTP servers on 127.0.0.1 at time scale %g (%s of wall time), streamed; times below are model time.\n\n"+
		"| | virtual | real |\n|---|---|---|\n| TTFT p50 (ms) | %s | %s |\n| TTFT p99 (ms) | %s | %s |\n| E2E p99 (ms) | %s | %s |\n\n"+
		"Per request, mean |real − virtual|: TTFT %s ms (%.1f%% of the real value), E2E %s ms (%.1f%%: %.1f%% for the requests on the standard pod, "+
		"where prefill–decode interference acts, %.1f%% for the PD pairs). "+
		"In the virtual run %.1f%% of the standard pod's iterations carried a prefill chunk beside decodes (interference). "+
		"The real servers add HTTP, JSON and timer overheads (divided by the time scale, so magnified %g×); the virtual engine has none.\n\n",
		v.workload, v.rate, v.n, v.workload, v.rate, v.scale, v.wall.Round(time.Millisecond), ms(v.virtP50), ms(v.realP50), ms(v.virtP99), ms(v.realP99),
		ms(v.virtE2E99), ms(v.realE2E99), ms(v.ttftMAE), v.ttftRel*100, ms(v.e2eMAE), v.e2eRel*100, v.e2eRelPath[0]*100, v.e2eRelPath[1]*100, v.stalledShare*100, 1/v.scale)
}
