// Package advisor owns the P:D ratio advice: for each model of the pool, how close its
// prefill, decode and standard pods are to missing their latency objectives (per-stage
// saturation, and the stage that binds), and the split of its pods between those roles that
// would serve the traffic of a recent window at the highest SLO-goodput rate, as the latency
// models predict it. It reads what other packages learn (every routed request's outcome, the
// latency models' fitted coefficients, the engines' scraped KV capacity) and decides nothing
// about routing.
package advisor

import (
	"sort"
	"sync"
	"time"

	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Options configure an Advisor. Zero values take the defaults named on each field.
type Options struct {
	Clock load.Clock // the system clock
	// Models are the latency models whose coefficients price a pod's work; Samples the
	// engines' scraped signals (KV capacity); either may be nil (the models' defaults, no
	// KV bound).
	Models  *latency.Models
	Samples func(key string) *metrics.Sample
	// Window is how far back the traffic the advice rests on reaches (60 s).
	Window time.Duration
	// TTFT and TPOT are the objectives a request is held to: TTFT the larger of TTFT (1 s)
	// and TTFTPrefill (3) times the request's own prefill on an idle pod, TPOT (50 ms).
	TTFT        time.Duration
	TTFTPrefill float64
	TPOT        time.Duration
	// Goodput is the share of requests that must meet both objectives for a rate to count
	// as served (0.9).
	Goodput float64
}

// Defaults of Options.
const (
	DefaultWindow      = time.Minute
	DefaultTTFT        = time.Second
	DefaultTTFTPrefill = 3.0
	DefaultTPOT        = 50 * time.Millisecond
	DefaultGoodput     = 0.9
)

// maxSamples bounds the completions kept, over every model: beyond it the oldest are dropped
// and the rate is measured over the span the kept ones cover (at 1,000 req/s, a minute).
const maxSamples = 65536

// sample is one request that completed: where it ran and its size.
type sample struct {
	at time.Time
	// picked and prefilled bound the prefill leg of a PD request on its prefill pod (zero
	// when no leg ran or its end is unknown)
	picked, prefilled      time.Time
	kind                   outcome.Kind
	prefill, serve         string // endpoint keys; prefill is "" for a whole request
	prompt, cached, output int
}

// podInfo is what the advisor remembers of an endpoint from the snapshots it saw, so a
// pod's completions still count for a window after it left.
type podInfo struct {
	model string
	role  pool.Role
	seen  time.Time
}

// Advisor keeps the recent traffic and answers Advise. Safe for concurrent use; Observe is
// quick (it runs on the request path).
type Advisor struct {
	o     Options
	mu    sync.Mutex
	ring  []sample // a ring of the last maxSamples completions
	next  int      // where the next one goes
	full  bool
	first time.Time // the first completion observed
	// pods is every endpoint seen in a snapshot within the window; last each model's last
	// recommendation (the advice leaves it only for a predicted gain beyond tieMargin)
	pods map[string]podInfo
	last map[string]Split
	// learned is the observations at which a fit counts as learned (fitted; tests that
	// price with the defaults on purpose lower it)
	learned int
}

// New returns an Advisor.
func New(o Options) *Advisor {
	if o.Clock == nil {
		o.Clock = load.SystemClock{}
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.TTFT <= 0 {
		o.TTFT = DefaultTTFT
	}
	if o.TTFTPrefill <= 0 {
		o.TTFTPrefill = DefaultTTFTPrefill
	}
	if o.TPOT <= 0 {
		o.TPOT = DefaultTPOT
	}
	if o.Goodput <= 0 || o.Goodput >= 1 {
		o.Goodput = DefaultGoodput
	}
	return &Advisor{o: o, ring: make([]sample, 0, 256), pods: map[string]podInfo{}, last: map[string]Split{}, learned: fitted}
}

// Observe records a request that completed (outcome.Reader). A streamed response's chunks
// count its output tokens (vLLM, SGLang and TensorRT-LLM stream one token per event); a
// response that was not streamed counts as one token. A PD request whose prefill leg did
// not run (a gateway that forwards the request whole, a fallback to a standard pod) counts
// as run whole where it was served.
func (a *Advisor) Observe(e *outcome.Event) {
	if e.Phase != outcome.PhaseEnd || e.Route.Err != nil {
		return
	}
	r := &e.Route
	s := sample{at: r.End, kind: r.Kind, serve: r.ServedBy(), prompt: r.PromptTokens,
		cached: min(r.CachedTokens, r.PromptTokens), output: max(r.Chunks, 1)}
	if s.kind == outcome.KindPD {
		if r.PrefillErr != nil {
			s.kind = outcome.KindWhole
		} else {
			s.prefill = r.Prefill
			if r.PrefillEnd.After(r.Picked) {
				s.picked, s.prefilled = r.Picked, r.PrefillEnd
			}
		}
	}
	if s.at.IsZero() {
		s.at = a.o.Clock.Now()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.first.IsZero() {
		a.first = s.at
	}
	if len(a.ring) < maxSamples {
		a.ring = append(a.ring, s)
		return
	}
	a.ring[a.next] = s
	a.next = (a.next + 1) % maxSamples
	a.full = true
}

// recent copies the completions inside the window ending at now, oldest first, and says
// how many seconds of traffic they cover. Call with a.mu held.
func (a *Advisor) recentLocked(now time.Time) ([]sample, float64) {
	from := now.Add(-a.o.Window)
	span := a.o.Window.Seconds()
	if !a.first.IsZero() && a.first.After(from) {
		span = now.Sub(a.first).Seconds()
	}
	out := make([]sample, 0, len(a.ring))
	for i := range a.ring {
		s := a.ring[(a.next+i)%len(a.ring)]
		if !s.at.Before(from) && !s.at.After(now) {
			out = append(out, s)
		}
	}
	if a.full && len(out) == len(a.ring) && len(out) > 0 {
		// The ring dropped completions inside the window: the rate is over what it kept.
		span = now.Sub(out[0].at).Seconds()
	}
	return out, span
}

// Stage names, the stage label's values.
const (
	StagePrefill  = "prefill"
	StageDecode   = "decode"
	StageStandard = "standard"
)

// Split is how many pods of a model play each role.
type Split struct {
	Prefill  int `json:"prefill"`
	Decode   int `json:"decode"`
	Standard int `json:"standard"`
}

// Pods is the split's pod count.
func (s Split) Pods() int { return s.Prefill + s.Decode + s.Standard }

// Moves is how many pods must change role to turn s into t (the same pod count).
func (s Split) Moves(t Split) int {
	abs := func(x int) int { return max(x, -x) }
	return (abs(s.Prefill-t.Prefill) + abs(s.Decode-t.Decode) + abs(s.Standard-t.Standard)) / 2
}

// Saturation is each stage's load over the load at which it would just meet the objectives
// for the goodput share of its requests (0: no load or no pods; above 1: missing them;
// MaxSaturation: no load at all would meet them).
type Saturation struct {
	Prefill  float64 `json:"prefill"`
	Decode   float64 `json:"decode"`
	Standard float64 `json:"standard"`
}

// Advice is one model's advice.
type Advice struct {
	Model string `json:"model"`
	// WindowSeconds is the traffic span the advice rests on; Requests the completions in it
	// and Rate their rate (req/s).
	WindowSeconds float64 `json:"window_seconds"`
	Requests      int     `json:"requests"`
	Rate          float64 `json:"rate"`
	// Confidence in [0, 1]: how much traffic and how many fitted observations it rests on.
	Confidence float64 `json:"confidence"`
	// Current is the model's pods by role; Saturation each stage's, Binding the most
	// saturated stage ("" when no stage carries load).
	Current    Split      `json:"current"`
	Saturation Saturation `json:"saturation"`
	Binding    string     `json:"binding"`
	// Recommended is a split of Current's pod count with the highest predicted capacity
	// (req/s of this traffic at the goodput share), keeping at least one pod of each role
	// the pool has and adding none it has not: CurrentCapacity and RecommendedCapacity.
	// Recommended is Current when no split is predicted better by tieMargin, or when the
	// confidence is below minConfidence.
	Recommended         Split   `json:"recommended"`
	CurrentCapacity     float64 `json:"current_capacity"`
	RecommendedCapacity float64 `json:"recommended_capacity"`
	// Fits are the pooled latency fits the advice priced the traffic with.
	Fits Fits `json:"fits"`
}

// Fits are a model's pods' latency fits, pooled (each the mean over the pods that observed
// it, weighted by their observations): prefill seconds = base + per token × tokens + per
// token² × tokens²; decode step seconds = base + per request × requests resident + per KV
// token × KV tokens resident.
type Fits struct {
	// PrefillScale is how much longer a prompt's prefill is than the fit says, measured on
	// the prefill pods: the time they had a prompt in over the fitted prefill time of the
	// prompts (1 without enough PD traffic to measure it).
	PrefillScale        float64 `json:"prefill_scale"`
	PrefillBase         float64 `json:"prefill_base_seconds"`
	PrefillPerToken     float64 `json:"prefill_per_token_seconds"`
	PrefillPerToken2    float64 `json:"prefill_per_token_squared_seconds"`
	StepBase            float64 `json:"step_base_seconds"`
	StepPerRequest      float64 `json:"step_per_request_seconds"`
	StepPerKVToken      float64 `json:"step_per_kv_token_seconds"`
	KVTokens            float64 `json:"kv_capacity_tokens"` // 0: not scraped
	PrefillObservations int     `json:"prefill_observations"`
	StepObservations    int     `json:"step_observations"`
}

// Report is the advice for every model of a pool at one instant.
type Report struct {
	At         time.Time `json:"at"`
	Objectives struct {
		TTFTSeconds         float64 `json:"ttft_seconds"`
		TTFTPrefillMultiple float64 `json:"ttft_prefill_multiple"`
		TPOTSeconds         float64 `json:"tpot_seconds"`
		Goodput             float64 `json:"goodput"`
	} `json:"objectives"`
	Models []Advice `json:"models"`
}

// tieMargin: a split predicted within this factor of the best counts as best.
const tieMargin = 1.10

// minConfidence is the confidence below which the advice stands on the current split.
const minConfidence = 0.5

// MaxSaturation is the saturation of a stage no load would let meet the objectives (an
// objective below what one request alone takes there).
const MaxSaturation = 1000

// Advise computes the advice for every model of snap's endpoints, from the traffic of the
// window ending now.
func (a *Advisor) Advise(snap *pool.Snapshot) Report {
	now := a.o.Clock.Now()
	var rep Report
	rep.At = now
	rep.Objectives.TTFTSeconds, rep.Objectives.TTFTPrefillMultiple = a.o.TTFT.Seconds(), a.o.TTFTPrefill
	rep.Objectives.TPOTSeconds, rep.Objectives.Goodput = a.o.TPOT.Seconds(), a.o.Goodput
	if snap == nil {
		return rep
	}
	byModel := map[string][]*pool.Endpoint{}
	for _, e := range snap.Endpoints {
		byModel[e.Model] = append(byModel[e.Model], e)
	}
	models := make([]string, 0, len(byModel))
	for m := range byModel {
		models = append(models, m)
	}
	sort.Strings(models)

	a.mu.Lock()
	for _, e := range snap.Endpoints {
		a.pods[e.Key()] = podInfo{model: e.Model, role: e.Role, seen: now}
	}
	for k, p := range a.pods {
		if now.Sub(p.seen) > a.o.Window {
			delete(a.pods, k)
		}
	}
	for m := range a.last {
		if byModel[m] == nil {
			delete(a.last, m)
		}
	}
	samples, span := a.recentLocked(now)
	pods := make(map[string]podInfo, len(a.pods))
	for k, p := range a.pods {
		pods[k] = p
	}
	a.mu.Unlock()

	for _, m := range models {
		rep.Models = append(rep.Models, a.advise(m, byModel[m], pods, samples, span))
	}
	return rep
}

// priced is one model's traffic priced on its pods' fits: what its advice and Capacities
// are computed from.
type priced struct {
	t    traffic
	eng  engine
	cuts []cut
	ob   objectives
}

func (a *Advisor) price(model string, eps []*pool.Endpoint, pods map[string]podInfo, samples []sample, span float64) priced {
	p := priced{t: trafficOf(model, eps, pods, samples), eng: a.engine(eps), ob: a.objectives()}
	p.eng.calibrate(p.t)
	if len(p.t.mix) > 0 && span > 0 {
		p.cuts = p.eng.cuts(p.t.mix, p.t.longestWhole(), p.ob)
	}
	return p
}

// advise is one model's advice.
func (a *Advisor) advise(model string, eps []*pool.Endpoint, pods map[string]podInfo, samples []sample, span float64) Advice {
	p := a.price(model, eps, pods, samples, span)
	t, eng := p.t, p.eng
	ad := Advice{Model: model, WindowSeconds: span, Current: t.current, Recommended: t.current, Requests: len(t.mix)}
	ad.Fits = Fits{PrefillScale: eng.prefillScale, PrefillBase: eng.prefill[0], PrefillPerToken: eng.prefill[1], PrefillPerToken2: eng.prefill[2],
		StepBase: eng.step[0], StepPerRequest: eng.step[1], StepPerKVToken: eng.step[2], KVTokens: eng.kvCap,
		PrefillObservations: eng.prefillObs, StepObservations: eng.stepObs}
	ad.Confidence = min(1, float64(len(t.mix))/minRequests) * eng.confidence(a.learned)
	if len(t.mix) == 0 || span <= 0 {
		return ad
	}
	ad.Rate = float64(len(t.mix)) / span
	ad.Saturation = t.saturation(&eng, p.ob, span)
	most := 0.0
	for _, st := range []struct {
		name string
		v    float64
	}{{StagePrefill, ad.Saturation.Prefill}, {StageDecode, ad.Saturation.Decode}, {StageStandard, ad.Saturation.Standard}} {
		if st.v > most {
			most, ad.Binding = st.v, st.name
		}
	}
	if ad.Current.Prefill == 0 || ad.Current.Decode == 0 {
		return ad // no pair to keep: nothing to split
	}
	ad.CurrentCapacity = capacityOf(p.cuts, ad.Current)
	ad.RecommendedCapacity = ad.CurrentCapacity
	if ad.Confidence < minConfidence {
		return ad // too little to go on: stand on the current split
	}

	// The current split while it is predicted within tieMargin of the best; else the last
	// recommendation while it is (advice that follows traffic, not noise); else the split
	// within tieMargin of the best nearest to the last recommendation (or to the current
	// split, before any).
	anchor := ad.Current
	a.mu.Lock()
	if last, ok := a.last[model]; ok && last.Pods() == ad.Current.Pods() && allowed(last, ad.Current) {
		anchor = last
	}
	a.mu.Unlock()
	splits := candidates(ad.Current, anchor)
	caps := make([]float64, len(splits))
	top := 0.0
	for i, s := range splits {
		caps[i] = capacityOf(p.cuts, s)
		top = max(top, caps[i])
	}
	switch anchorCap := capacityOf(p.cuts, anchor); {
	case ad.CurrentCapacity*tieMargin >= top:
	case anchorCap*tieMargin >= top:
		ad.Recommended, ad.RecommendedCapacity = anchor, anchorCap
	default:
		i := pick(splits, caps, top, anchor)
		ad.Recommended, ad.RecommendedCapacity = splits[i], caps[i]
	}
	a.mu.Lock()
	a.last[model] = ad.Recommended
	a.mu.Unlock()
	return ad
}

// Capacities predicts, for a model of snap, the capacity (req/s of the window's traffic at
// the goodput share) of every split of its pods that keeps a pair, whatever roles the pool
// has; nil without traffic or a pair. For benchmarks that measure the splits.
func (a *Advisor) Capacities(snap *pool.Snapshot, model string) map[Split]float64 {
	var eps []*pool.Endpoint
	for _, e := range snap.Endpoints {
		if e.Model == model {
			eps = append(eps, e)
		}
	}
	now := a.o.Clock.Now()
	a.mu.Lock()
	samples, span := a.recentLocked(now)
	pods := make(map[string]podInfo, len(eps))
	for _, e := range eps {
		pods[e.Key()] = podInfo{model: e.Model, role: e.Role, seen: now}
	}
	a.mu.Unlock()
	p := a.price(model, eps, pods, samples, span)
	if p.cuts == nil || p.t.current.Prefill == 0 || p.t.current.Decode == 0 {
		return nil
	}
	out := map[Split]float64{}
	for _, s := range Splits(p.t.current.Pods()) {
		out[s] = capacityOf(p.cuts, s)
	}
	return out
}

// pick chooses among the splits predicted within tieMargin of the best: the fewest moves
// from anchor, then the highest prediction, then the most decode pods (a decode pod can run a
// prompt whole as a standard pod does, and can also take a pair's decode). It returns the
// index in splits.
func pick(splits []Split, caps []float64, top float64, anchor Split) int {
	best := -1
	for i, s := range splits {
		if caps[i]*tieMargin < top {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := splits[best]
		switch m, mb := s.Moves(anchor), b.Moves(anchor); {
		case m != mb:
			if m < mb {
				best = i
			}
		case caps[i] != caps[best]:
			if caps[i] > caps[best] {
				best = i
			}
		case s.Decode > b.Decode:
			best = i
		}
	}
	return best
}

// minRequests is the window's completions at which the traffic counts as fully known.
const minRequests = 500

// Splits lists every split of n pods that keeps at least one prefill and one decode pod,
// fewest prefill pods first, then fewest decode pods.
func Splits(n int) []Split {
	var out []Split
	for p := 1; p < n; p++ {
		for d := 1; p+d <= n; d++ {
			out = append(out, Split{p, d, n - p - d})
		}
	}
	return out
}

// allowed says whether s keeps every role cur has and adds none it has not: the advice
// moves pods between the workloads an autoscaler scales, it does not make or retire one.
func allowed(s, cur Split) bool {
	has := func(n int) bool { return n > 0 }
	return has(s.Prefill) && has(s.Decode) && has(s.Standard) == has(cur.Standard)
}

// fullSearch is the pod count up to which every split is priced; above it, a grid of about
// gridSteps² splits and every split within nearMoves moves of the current one and the anchor.
const (
	fullSearch = 64
	gridSteps  = 32
	nearMoves  = 2
)

// candidates are the splits of cur's pod count the advice chooses from.
func candidates(cur, anchor Split) []Split {
	n := cur.Pods()
	var out []Split
	if n <= fullSearch {
		for _, s := range Splits(n) {
			if allowed(s, cur) {
				out = append(out, s)
			}
		}
		return out
	}
	seen := map[Split]bool{}
	add := func(s Split) {
		if s.Prefill >= 0 && s.Decode >= 0 && s.Standard >= 0 && s.Pods() == n && allowed(s, cur) && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	step := (n + gridSteps - 1) / gridSteps
	for p := 1; p < n; p += step {
		for d := 1; p+d <= n; d += step {
			add(Split{p, d, n - p - d})
			if cur.Standard > 0 {
				add(Split{p, n - p - max(cur.Standard, 1), max(cur.Standard, 1)})
			}
		}
	}
	for _, c := range []Split{cur, anchor} {
		for dp := -nearMoves; dp <= nearMoves; dp++ {
			for dd := -nearMoves; dd <= nearMoves; dd++ {
				add(Split{c.Prefill + dp, c.Decode + dd, c.Standard - dp - dd})
			}
		}
	}
	return out
}

// objectives are the advisor's objectives in seconds.
type objectives struct {
	ttft, ttftPrefill, tpot, goodput float64
}

func (a *Advisor) objectives() objectives {
	return objectives{ttft: a.o.TTFT.Seconds(), ttftPrefill: a.o.TTFTPrefill, tpot: a.o.TPOT.Seconds(), goodput: a.o.Goodput}
}
