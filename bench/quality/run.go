package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/advisor"
	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/sim"
)

// clusterSpec is a pool shape: rolesets of prefill+decode pods plus standard (combined) pods.
type clusterSpec struct {
	name     string
	rolesets int
	prefill  int // per roleset
	decode   int // per roleset
	standard int
	zones    int // >0: the pods of each side alternate over this many zones (bench/quality/topology.go)
}

var clusterRE = regexp.MustCompile(`^(\d+)x(\d+)p(\d+)d(?:\+(\d+)s)?(?:@(\d+)z)?$`)

// parseCluster reads "<rolesets>x<prefill>p<decode>d[+<standard>s][@<zones>z]", e.g.
// 4x1p1d+2s or 2x2p2d@2z.
func parseCluster(s string) (clusterSpec, error) {
	m := clusterRE.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return clusterSpec{}, fmt.Errorf("-clusters: %q: want <rolesets>x<prefill>p<decode>d[+<standard>s][@<zones>z], e.g. 4x1p1d+2s, 1x8p8d or 2x2p2d@2z", s)
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	c := clusterSpec{name: strings.ToLower(strings.TrimSpace(s)), rolesets: n(1), prefill: n(2), decode: n(3)}
	if m[4] != "" {
		c.standard = n(4)
	}
	if m[5] != "" {
		c.zones = n(5)
	}
	if c.rolesets < 1 || c.prefill < 1 || c.decode < 1 || c.rolesets*(c.prefill+c.decode)+c.standard > 1000 {
		return clusterSpec{}, fmt.Errorf("-clusters: %q: need at least one roleset of 1 prefill + 1 decode pod, at most 1000 pods", s)
	}
	return c, nil
}

// policy is one routing configuration compared in a run.
type policy struct {
	name     string
	strategy string // routing strategy (ROUTING_ALGORITHM); "pd" for the cascade
	prefill  string // AIBRIX_PREFILL_SCORE_POLICY
	decode   string // AIBRIX_DECODE_SCORE_POLICY
	bucket   bool   // prompt-length bucketing + adaptive bucket serving
	rr       bool   // the bench's round-robin scheduler, not Tandem
	file     string // a --config-file composing the strategy (strategy names its handler)
	// topologyOff: TANDEM_TOPOLOGY_LABELS=none (topology-blind pairing)
	topologyOff bool
}

// allPolicies is the comparison set, in report order.
var allPolicies = []policy{
	{name: "random", strategy: picker.StrategyRandom},
	{name: "round-robin", rr: true},
	{name: "least-request-nopd", strategy: picker.StrategyLeastRequest},
	{name: "least_request", strategy: pd.StrategyName, prefill: "least_request", decode: "least_request"},
	{name: "seed-default", strategy: pd.StrategyName, prefill: "prefix_cache", decode: "load_balancing"},
	{name: "conductor", strategy: pd.StrategyName, prefill: "conductor", decode: "conductor"},
	{name: "token_load", strategy: pd.StrategyName, prefill: "token_load", decode: "token_load"},
	{name: "hybrid_cache_load", strategy: pd.StrategyName, prefill: "hybrid_cache_load", decode: "token_load"},
	{name: "seed-default+bucket", strategy: pd.StrategyName, prefill: "prefix_cache", decode: "load_balancing", bucket: true},
	{name: "hybrid_cache_load+bucket", strategy: pd.StrategyName, prefill: "hybrid_cache_load", decode: "token_load", bucket: true},
	{name: "pd-predictive", strategy: pd.StrategyPredictive},
	{name: "pd-predictive-miss", strategy: "predictive-miss", file: predictiveMissFile},
}

// predictiveMissFile is pd-predictive composed in a --config-file with the standard pods
// used only on a predicted miss of the TTFT objective (slo-overflow-decider mode miss): the
// overflow rule as issue 18 states it.
const predictiveMissFile = `
plugins:
- {type: pd-role-filter, name: prefill-pods, parameters: {role: prefill}}
- {type: pd-role-filter, name: decode-pods, parameters: {role: decode}}
- {type: pd-role-filter, name: combined-pods, parameters: {role: combined}}
- type: prompt-length-bucket-filter
- {type: prefill-policy-scorer, parameters: {policy: predicted_ttft}}
- {type: decode-policy-scorer, parameters: {policy: predicted_tpot}}
- type: selective-pd-decider
- {type: slo-overflow-decider, parameters: {mode: miss}}
- type: roleset-pd-profile-handler
  name: predictive-miss
  parameters:
    deciders: {selective: selective-pd-decider, sloOverflow: slo-overflow-decider}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-pods}, {pluginRef: prompt-length-bucket-filter}, {pluginRef: prefill-policy-scorer}]
- name: decode
  plugins: [{pluginRef: decode-pods}, {pluginRef: prompt-length-bucket-filter}, {pluginRef: decode-policy-scorer}]
- name: combined
  plugins: [{pluginRef: combined-pods}, {pluginRef: prompt-length-bucket-filter}]
`

// describe says what a policy is, for the report.
func (p policy) describe() string {
	switch {
	case p.rr:
		return "bench round-robin over every pod, role-unaware (what lwepp does); whole request on one pod"
	case p.file != "":
		return "`pd-predictive` composed in a --config-file with `slo-overflow-decider` mode `miss`: a standard pod only when PD is predicted to miss the TTFT objective (issue 18's overflow rule as written)"
	case p.strategy == pd.StrategyPredictive:
		return "Tandem `pd-predictive` strategy: pairs by predicted TTFT + TPOT from online per-pod models fitted to what the gateway observed, runs a prompt whole on a decode pod when predicted cheaper (selective-pd-decider), sends a request to a standard pod when that is predicted cheaper than PD within the TPOT objective (slo-overflow-decider mode cost); no request here is sheddable, so none is refused"
	case p.strategy != pd.StrategyName:
		return "Tandem `" + p.strategy + "` strategy: one non-prefill pod serves the whole request"
	}
	s := fmt.Sprintf("Tandem `pd` cascade, prefill=%s decode=%s", p.prefill, p.decode)
	if p.bucket {
		s += ", promptLengthBucketing + bucketServe"
	}
	return s
}

// gateway is the configuration a user would set for the policy.
func (p policy) gateway(scrape float64) config.Gateway {
	gw := config.DefaultGateway()
	gw.DefaultStrategy = p.strategy
	if p.prefill != "" {
		gw.PD.PrefillScorePolicy = p.prefill
		gw.PD.DecodeScorePolicy = p.decode
	}
	gw.PD.PromptLengthBucketing = p.bucket
	gw.PD.BucketServe = p.bucket
	if p.topologyOff {
		gw.PD.Topology = config.TopologyLabels{}
	}
	if scrape > 0 {
		gw.MetricRefreshInterval = secondsDur(scrape)
	}
	return gw
}

// endpoints builds the pool: every pod labelled for the model, PD pods with role and
// roleset, standard pods declared combined in the model.aibrix.ai/config annotation. With
// bucket serving, every pod declares the open range [0, unlimited] and lets the planner band
// prompt lengths adaptively (what a user enabling AIBRIX_BUCKET_SERVE writes).
func (c clusterSpec) endpoints(bucket bool) []*pool.Endpoint {
	annot := func(rc config.RoutingConfig) map[string]string {
		mc := config.ModelConfig{DefaultProfile: "default", Profiles: map[string]config.Profile{"default": {RoutingConfig: &rc}}}
		b, _ := json.Marshal(mc)
		return map[string]string{pool.AnnotationConfig: string(b)}
	}
	pdRC := config.RoutingConfig{}
	if bucket {
		t := true
		pdRC.PromptLengthBucketing, pdRC.BucketServe = &t, &t
	}
	var eps []*pool.Endpoint
	i := 0
	add := func(name string, labels map[string]string, rc config.RoutingConfig) {
		labels[pool.LabelModelName] = modelName
		labels[pool.LabelEngine] = pool.EngineVLLM
		// Loopback addresses: nothing ever connects to these virtual pods.
		eps = append(eps, pool.NewEndpoint("bench", name, fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250), 8000, 0, labels, annot(rc)))
		i++
	}
	for r := 0; r < c.rolesets; r++ {
		rs := fmt.Sprintf("rs%d", r)
		for k := 0; k < c.prefill; k++ {
			name, labels := fmt.Sprintf("%s-prefill-%d", rs, k), map[string]string{pool.LabelRoleName: "prefill", pool.LabelRolesetName: rs}
			placeIn(labels, name, k, c.zones)
			add(name, labels, pdRC)
		}
		for k := 0; k < c.decode; k++ {
			name, labels := fmt.Sprintf("%s-decode-%d", rs, k), map[string]string{pool.LabelRoleName: "decode", pool.LabelRolesetName: rs}
			placeIn(labels, name, k, c.zones)
			add(name, labels, pdRC)
		}
	}
	for k := 0; k < c.standard; k++ {
		rc := pdRC
		rc.Combined = true
		name, labels := fmt.Sprintf("standard-%d", k), map[string]string{}
		placeIn(labels, name, k, c.zones)
		add(name, labels, rc)
	}
	return eps
}

// record is what one request experienced, in virtual seconds.
type record struct {
	arrive   float64
	first    float64 // first token at the client
	done     float64
	out      int
	prompt   int
	outcome  picker.Outcome
	step     string
	idle     float64 // the request's own TTFT alone on an idle pod: PrefillSeconds(prompt)
	prefillC float64 // model time of its prefill leg, from its first scheduling to its first token
	sloTTFT  float64 // its SLO bounds (also sent as x-slo-ttft-ms / x-slo-tpot-ms)
	sloTPOT  float64
	measured bool // arrived inside the measurement window (not warm-up or cool-down)
	preempt  int  // times its sequences lost their KV
	// where its work ran: the pods of its prefill and of its decode ("prefill", "decode", "standard")
	prefillOn, decodeOn string
	// the keys of those pods (the same pod for a whole request)
	prefillPod, decodePod string
	failed                string
}

func (r *record) ttft() float64 { return r.first - r.arrive }
func (r *record) e2e() float64  { return r.done - r.arrive }
func (r *record) tpot() float64 {
	if r.out <= 1 {
		return 0
	}
	return (r.done - r.first) / float64(r.out-1)
}

// queueing is TTFT minus the request's own idle-pod TTFT: what waiting (and routing) added.
func (r *record) queueing() float64 { return r.ttft() - r.idle }

// slowdown is TTFT over the request's own idle-pod TTFT.
func (r *record) slowdown() float64 { return r.ttft() / max(r.idle, 1e-9) }

// good says whether the request met both of its SLOs.
func (r *record) good() bool {
	return r.failed == "" && r.ttft() <= r.sloTTFT && (r.out <= 1 || r.tpot() <= r.sloTPOT)
}

// runOpts are the knobs of one run.
type runOpts struct {
	params sim.Params
	scrape float64 // scrape interval, seconds
	seed   uint64
	// scenario is the engine scenario of every pod (sim.ScenarioNames; "" is none), seeded
	// by scenarioSeed; the router is not told
	scenario     string
	scenarioSeed uint64
	rate         float64          // offered requests per second (a Poisson process); 0: the workload's own arrival times
	sched        picker.Scheduler // when set, routes instead of the policy (validation)
	// advise: ask the P:D ratio advisor for its advice every so many virtual seconds while
	// requests arrive, and once at the end (0: never)
	advise float64
}

// timedAdvice is the advisor's report at a virtual time.
type timedAdvice struct {
	at  float64
	rep advisor.Report
}

// runResult is one (workload, cluster, policy, load) run.
type runResult struct {
	recs        []record
	span        float64 // virtual seconds of the measurement window (arrivals counted in the statistics)
	bucketSteps int
	// busy seconds of the pods of each class ("prefill", "decode", "standard") inside the
	// run, the pods of each class, and the run's length (first arrival to last completion)
	busy   map[string]float64
	pods   map[string]int
	length float64
	// iterations on the standard (combined) pods, and those that carried prefill and decode
	// work together (prefill pods decode nothing, decode pods prefill nothing)
	stdIterations, stdMixed int
	note                    string
	// pred is how far the latency models' TTFT predictions were from the TTFTs the
	// gateway observed (pd-predictive only; zero N otherwise), per repetition.
	pred []latency.ErrorSummary
	// under an engine scenario: the calibrated and the perturbed seconds of every iteration
	// run (their ratio is the realised cost ratio), and every stalled iteration
	baseSeconds, scenSeconds float64
	stalls                   []stallEvent
	// advice is the advisor's reports (runOpts.advise), and its predicted capacity of every
	// split of the pods at the end
	advice    []timedAdvice
	predicted map[advisor.Split]float64
}

// costRatio is the realised cost ratio of the run's engine scenario (1 without one).
func (r *runResult) costRatio() float64 {
	if r.baseSeconds == 0 {
		return 1
	}
	return r.scenSeconds / r.baseSeconds
}

// stallRouted is how many requests were routed, while a pod stalled, to that pod (prefill or
// decode), and the stalled pod-seconds while requests arrived (stalls after the last arrival,
// while queues drain, can receive nothing): their ratio is requests sent into a stall per
// second of stall. unseen counts the routed requests that arrived before every stalled
// iteration they met had lasted as long as it would have without the stall: then no router
// could have any evidence of the stall, so rate × unseen time per stall-second is a floor no policy that
// routes to the pod at all goes below.
func (r *runResult) stallRouted() (routed, unseen int, seconds float64) {
	if len(r.recs) == 0 {
		return 0, 0, 0
	}
	first, last := r.recs[0].arrive, r.recs[0].arrive
	for i := range r.recs {
		first, last = min(first, r.recs[i].arrive), max(last, r.recs[i].arrive)
	}
	byPod := map[string][]stallEvent{}
	for _, s := range r.stalls {
		byPod[s.pod] = append(byPod[s.pod], s)
		seconds += max(0, min(s.to, last)-max(s.from, first))
	}
	for i := range r.recs {
		q := &r.recs[i]
		if q.failed != "" {
			continue
		}
		in := stallsOf(q, byPod)
		if len(in) == 0 {
			continue
		}
		routed++
		if !slices.ContainsFunc(in, func(s stallEvent) bool { return q.arrive >= s.from+(s.to-s.from)/sim.StallFactor }) {
			unseen++
		}
	}
	return routed, unseen, seconds
}

// stallsOf is the stalls q arrived in: on its prefill pod, then on its decode pod.
func stallsOf(q *record, byPod map[string][]stallEvent) []stallEvent {
	var in []stallEvent
	for j, pod := range []string{q.prefillPod, q.decodePod} {
		if j == 1 && pod == q.prefillPod {
			break
		}
		for _, s := range byPod[pod] {
			if q.arrive >= s.from && q.arrive < s.to {
				in = append(in, s)
				break
			}
		}
	}
	return in
}

// rrScheduler is the bench's round-robin: every pod in turn, ignoring roles and load —
// what upstream lwepp does. Not Tandem code.
type rrScheduler struct{ next int }

func (s *rrScheduler) Schedule(_ context.Context, _ *request.Request, _ *pool.Snapshot, cands []*pool.Endpoint) (*picker.Decision, error) {
	e := cands[s.next%len(cands)]
	s.next++
	return &picker.Decision{Strategy: "round-robin", Outcome: picker.OutcomeSingle, Destination: []*pool.Endpoint{e}}, nil
}

// errNotRegistered marks a policy the tree does not provide yet.
type errNotRegistered struct{ err error }

func (e errNotRegistered) Error() string { return e.err.Error() }

// simulate replays w through the policy on the cluster.
func simulate(w *workload, c clusterSpec, pol policy, o runOpts) (*runResult, error) {
	d := newDES()
	eps := c.endpoints(pol.bucket)
	store := pool.NewStore()
	snap := store.Publish(pool.Info{Name: "bench", Namespace: "bench", TargetPorts: []int32{8000}}, eps, true)
	pods := make(map[string]*vpod, len(eps))
	podList := make([]*vpod, len(eps))
	res := &runResult{recs: make([]record, len(w.reqs)), busy: map[string]float64{}, pods: map[string]int{}}
	var calib []int
	if o.scenario != "" && o.scenario != sim.ScenarioNone {
		calib = make([]int, len(w.reqs))
		for i, q := range w.reqs {
			calib[i] = q.prompt
		}
	}
	roleCount, roleIndex := map[string]int{}, map[string]int{}
	for i, e := range snap.Endpoints {
		podList[i] = newPod(d, e, o.params)
		pods[e.Key()] = podList[i]
		roleCount[podList[i].class]++
	}
	for _, v := range podList {
		if o.scenario == "" {
			break
		}
		x, err := sim.NewPerturbation(o.scenario, o.scenarioSeed, o.params,
			sim.PodRole{Role: v.class, Index: roleIndex[v.class], Count: roleCount[v.class]}, calib)
		if err != nil {
			return nil, err
		}
		roleIndex[v.class]++
		if x != nil {
			v.perturb, v.stalls = x, &res.stalls
			v.b.Cost = x.Cost
		}
	}
	var sched picker.Scheduler
	var deps *picker.Deps
	var models *latency.Models
	var adv *advisor.Advisor
	if o.sched != nil {
		sched = o.sched
	} else if pol.rr {
		sched = &rrScheduler{}
	} else {
		var file *config.File
		if pol.file != "" {
			f, err := config.ParseFile(pol.name+".yaml", []byte(pol.file), config.FileOptions{KnownPluginTypes: pd.IsPluginType})
			if err != nil {
				return nil, errNotRegistered{err}
			}
			file = f
		}
		pk, err := app.BuildPicker(app.PickerOptions{Clock: d.clock, Gateway: pol.gateway(o.scrape), File: file, Logger: logr.Discard()})
		if err != nil {
			return nil, errNotRegistered{err}
		}
		router, dp := pk.Router, pk.Deps
		adv = pk.Advisor
		if pol.strategy == pd.StrategyPredictive || pol.file != "" {
			models = pk.Models
		}
		// Warm the prefix index synchronously: production's warmer applies warms within
		// microseconds, which in virtual time is "before the next request".
		dp.Warmer = nil
		// Every random choice of the picker (ties, the random strategy) draws from a
		// source seeded by the run's seed, so a run is reproducible.
		dp.Rand = rand.New(rand.NewPCG(o.seed, 0x7a4d3e)).IntN
		sched, deps = router, dp
	}

	arrivals := w.arrivals(o.rate, o.seed)
	lo, hi := measureWindow(len(arrivals))
	res.span = arrivals[hi-1] - arrivals[lo]
	pending := len(w.reqs)
	// Scrapes publish every pod's state at the interval; between scrapes the picker sees
	// the last one (stale), exactly as from the production scraper.
	var scrape func()
	scrape = func() {
		if deps != nil {
			for _, p := range podList {
				deps.Metrics.Put(p.ep.Key(), p.sample())
			}
		}
		if pending > 0 {
			d.after(o.scrape, scrape)
		}
	}
	d.at(0, scrape)
	if o.advise > 0 && adv != nil {
		var advise func()
		advise = func() {
			res.advice = append(res.advice, timedAdvice{at: d.now, rep: adv.Advise(snap)})
			if pending > 0 {
				d.after(o.advise, advise)
			}
		}
		d.at(o.advise, advise)
	}

	ctx := context.Background()
	for i := range w.reqs {
		q := &w.reqs[i]
		rec := &res.recs[i]
		rec.arrive = arrivals[i]
		rec.out, rec.prompt = q.out, q.prompt
		rec.idle = sim.PrefillSeconds(o.params, q.prompt)
		rec.sloTTFT, rec.sloTPOT = q.sloTTFT, q.sloTPOT
		rec.measured = i >= lo && i < hi
		d.at(rec.arrive, func() {
			finish := func() { pending-- }
			req, err := request.Parse("POST", "/v1/completions",
				map[string]string{"x-request-id": strconv.Itoa(q.id), "content-type": "application/json",
					headerSLOTTFT: strconv.Itoa(int(q.sloTTFT * 1000)), headerSLOTPOT: strconv.Itoa(int(q.sloTPOT * 1000))}, q.body)
			if err != nil {
				rec.failed = "parse: " + err.Error()
				finish()
				return
			}
			dec, err := sched.Schedule(ctx, req, snap, snap.Endpoints)
			if err != nil {
				rec.failed = "schedule: " + err.Error()
				finish()
				return
			}
			rec.outcome, rec.step = dec.Outcome, dec.Step
			if strings.Contains(dec.Step, pd.StepBucketServe) {
				res.bucketSteps++
			}
			if dec.Trace != nil && strings.Contains(dec.Trace.Note, "unknown") && res.note == "" {
				res.note = dec.Trace.Note
			}
			dest := pods[dec.Destination[0].Key()]
			rec.decodePod = dest.ep.Key()
			if dec.Outcome == picker.OutcomePD && len(dec.Prefill) > 0 {
				rec.prefillPod = dec.Prefill[0].Key()
			} else {
				rec.prefillPod = rec.decodePod
			}
			if dec.Outcome == picker.OutcomePD && len(dec.Prefill) > 0 {
				runPD(d, q, rec, pods[dec.Prefill[0].Key()], dest, dec.Lifecycle, finish)
			} else {
				runPlain(d, q, rec, dest, dec.Lifecycle, finish)
			}
		})
	}
	d.run()
	if o.advise > 0 && adv != nil {
		res.advice = append(res.advice, timedAdvice{at: d.now, rep: adv.Advise(snap)})
		res.predicted = adv.Capacities(snap, modelName)
	}
	if pending != 0 {
		return nil, fmt.Errorf("%s/%s: %d requests never finished (simulation bug)", w.name, pol.name, pending)
	}
	for _, r := range res.recs {
		res.length = max(res.length, r.done)
	}
	if models != nil {
		res.pred = []latency.ErrorSummary{models.Errors()}
		if os.Getenv("DEBUG_MODELS") != "" {
			var badT, badP int
			var worstP float64
			for _, r := range res.recs {
				if !r.measured {
					continue
				}
				if r.ttft() > r.sloTTFT {
					badT++
				}
				if r.out > 1 && r.tpot() > r.sloTPOT {
					badP++
					worstP = max(worstP, r.tpot())
					fmt.Fprintf(os.Stderr, "   tpot miss %.1fms out %d prompt %d on %s/%s\n", r.tpot()*1000, r.out, r.prompt, r.prefillOn, r.decodeOn)
				}
			}
			fmt.Fprintf(os.Stderr, "ttft misses %d tpot misses %d worst tpot %.1fms\n", badT, badP, worstP*1000)
			fmt.Fprintf(os.Stderr, "rate %.1f errors %+v\n", o.rate, models.Errors())
			for _, e := range snap.Endpoints {
				fmt.Fprintf(os.Stderr, "  %s %+v\n", e.Name, models.Coefficients(e.Key()))
			}
		}
	}
	for _, p := range podList {
		if p.perturb != nil {
			res.baseSeconds += p.perturb.BaseSeconds
			res.scenSeconds += p.perturb.Seconds
		}
		res.busy[p.class] += p.b.BusySeconds
		res.pods[p.class]++
		if p.class == "standard" {
			res.stdIterations += p.b.Iterations
			res.stdMixed += p.b.Mixed
		}
	}
	return res, nil
}

// The SLO headers a request carries (llm-d's names), so a policy may read its bounds.
const (
	headerSLOTTFT = "x-slo-ttft-ms"
	headerSLOTPOT = "x-slo-tpot-ms"
)

// measureWindow is the arrivals counted in the statistics: the first and last 10 % are
// warm-up (the cluster fills) and cool-down (arrivals stop, queues drain), left out.
func measureWindow(n int) (lo, hi int) {
	lo, hi = n/10, n-n/10
	if hi-lo < 2 {
		return 0, n
	}
	return lo, hi
}

// sseChunk is the size of one streamed token chunk on the wire, for ResponseBody.
const sseChunk = 160

// tokens returns the handler of a client-facing sequence: it streams each token to the
// lifecycle hooks and finishes the request with its last one.
func tokens(d *des, q *wreq, rec *record, v *vpod, lc picker.Lifecycle, finish func()) handler {
	return func(e sim.Event) {
		switch e.Kind {
		case sim.EvToken:
			v.gen++
			i := e.Seq.Generated()
			if i == 1 {
				rec.first = d.now
				if lc != nil {
					lc.ResponseHeaders(200, v.ep)
				}
			}
			if lc != nil {
				lc.ResponseBody(sseChunk, i == q.out)
			}
		case sim.EvFinished:
			rec.done = d.now
			if lc != nil {
				lc.Done(nil)
			}
			finish()
		case sim.EvPreempted:
			rec.preempt++
		}
	}
}

// runPlain serves a whole request on one pod.
func runPlain(d *des, q *wreq, rec *record, v *vpod, lc picker.Lifecycle, finish func()) {
	rec.prefillOn, rec.decodeOn = v.class, v.class
	s := &sim.Seq{Kind: sim.SeqWhole, Prompt: q.prompt, Out: q.out, Hashes: q.hashes}
	stream := tokens(d, q, rec, v, lc, finish)
	v.add(s, func(e sim.Event) {
		if e.Kind == sim.EvToken && e.Seq.Generated() == 1 {
			prefilled(v, rec, e.Seq)
		}
		stream(e)
	})
}

// prefilled records a prefill's time, as the pod's prefill-time histogram and the request see it.
func prefilled(v *vpod, rec *record, s *sim.Seq) {
	rec.prefillC = s.PrefillSeconds()
	v.prefillS += rec.prefillC
	v.prefillN++
}

// runPD serves the prefill leg on pf, then the decode leg on dc (a decode-side sidecar's
// order: prefill call first, decode after it returns).
func runPD(d *des, q *wreq, rec *record, pf, dc *vpod, lc picker.Lifecycle, finish func()) {
	rec.prefillOn, rec.decodeOn = pf.class, dc.class
	ps := &sim.Seq{Kind: sim.SeqPrefill, Prompt: q.prompt, Out: 1, Hashes: q.hashes}
	pf.add(ps, func(e sim.Event) {
		switch e.Kind {
		case sim.EvToken:
			pf.gen++
			prefilled(pf, rec, ps)
		case sim.EvPreempted:
			rec.preempt++
		case sim.EvHeld:
			if po, ok := lc.(pd.PrefillObserver); ok {
				po.PrefillDone(nil)
			}
			ds := &sim.Seq{Kind: sim.SeqDecode, Prompt: q.prompt, Out: q.out, Hashes: q.hashes}
			stream := tokens(d, q, rec, dc, lc, finish)
			dc.add(ds, func(e sim.Event) {
				if e.Kind != sim.EvAllocated {
					stream(e)
					return
				}
				// The decode pod holds KV for the prompt: the pull starts, the prefill pod's
				// KV is released, and the transfer takes its turn on the decode pod's link.
				pf.b.Release(ps)
				pf.kick()
				end := dc.link.Reserve(d.now, transferSeconds(dc.p, pf, dc, q.prompt))
				d.at(end, func() {
					dc.b.Remember(q.hashes)
					dc.b.Ready(ds)
					dc.kick()
				})
			})
		}
	})
}
