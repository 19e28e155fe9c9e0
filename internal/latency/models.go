package latency

import (
	"math"
	"sync"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Observer receives every TTFT prediction with its outcome, for the prediction-error metric.
// kind is the route kind ("pd", "whole"); endpoint the pod that served.
type Observer interface {
	TTFTPrediction(kind, endpoint string, predicted, observed time.Duration)
}

// Remote adds what other gateway replicas booked: the prefill seconds still ahead on an
// endpoint at now according to their ledgers (a shared store implements it).
type Remote interface {
	Backlog(key string, now time.Time) float64
}

// Options configure Models.
type Options struct {
	Clock    load.Clock // nil: the system clock
	Defaults Defaults   // zero: DefaultDefaults()
	Observer Observer   // nil: none
	// IgnoreEngineQueue turns off adding the engines' waiting prompts that Tandem did not
	// route (another replica's, without a shared store) to a pod's predicted wait.
	IgnoreEngineQueue bool
	// Samples returns an endpoint's latest scraped sample (nil: none); a prediction reads
	// the engine's own view (running, waiting, KV, the prefill-time histogram) from it.
	Samples func(key string) *metrics.Sample
}

// Models are the latency models of every endpoint Tandem routes to, keyed by endpoint key.
// It is an outcome.Reader (it learns from routed requests) and answers predictions at pick
// time. Safe for concurrent use.
type Models struct {
	mu       sync.Mutex
	d        Defaults
	clock    load.Clock
	obs      Observer
	noEngine bool
	samples  func(key string) *metrics.Sample
	pods     map[string]*pod
	routes   map[uint64]*route
	remote   Remote
	onCharge func(key string)
	errs     errorStats
	// gen counts the Forgets that dropped a pod: a pod memoised on an endpoint (podOfLocked)
	// is the key's pod while gen is unchanged.
	gen uint64
}

// podMemo keeps each endpoint's pod of a Models on the endpoint.
var podMemo = pool.NewMemo()

// route is what the models remember of one routed request until it ends.
type route struct {
	kind            outcome.Kind
	prefillOn, dest string // the pod whose ledger holds the prefill, the destination
	tokens          int
	distance        int    // the pair's distance class (-1: unknown)
	prompt          Prompt // as the prefill-running pod sees it
	picked          time.Time
	charged         bool
	service         float64   // predicted prefill seconds
	due             time.Time // predicted end of the prefill on the ledger, at booking
	shiftAt         float64   // the ledger's shift at booking
	unseenHist      bool      // at booking, the engine's queue histogram showed work the ledger does not hold
	ttft, tpot      float64   // predicted at pick, seconds (0: none)
	prefillDone     bool
	ahead           float64 // the prefill seconds booked ahead of it on the ledger at its pick
	// grace: seconds after its due the prefill's end may be seen without being late (an
	// end inferred from the decode pod's answer includes the hand-over).
	grace float64
	// legDue: when the decode leg's first byte is predicted, once the prefill ended
	// elsewhere.
	legDue            time.Time
	destBacklog       float64 // the destination's booked prefill and one iteration when the prefill ended
	tpotObjective     float64
	maxTokens         int
	firstByte         time.Time
	lastChunk         time.Time // the last chunk of its answer
	cumAtFirst        float64   // the destination's finished prefill seconds at the first byte
	nAtFirst, kvFirst float64
	// life.gone: the route ended or was forgotten (it is no longer in Models.routes). Its
	// own allocation: the stall budgets hold it, not the route.
	life *routeLife
}

// routeTTL: a route with no event for this long is forgotten (its events were lost).
const routeTTL = 15 * time.Minute

// New returns empty models.
func New(o Options) *Models {
	if o.Clock == nil {
		o.Clock = load.SystemClock{}
	}
	if o.Defaults == (Defaults{}) {
		o.Defaults = DefaultDefaults()
	}
	return &Models{d: o.Defaults, clock: o.Clock, obs: o.Observer, noEngine: o.IgnoreEngineQueue, samples: o.Samples,
		pods: map[string]*pod{}, routes: map[uint64]*route{}}
}

// Now is the models' clock.
func (m *Models) Now() time.Time { return m.clock.Now() }

// SetRemote makes predicted waits include other replicas' bookings (nil: local only).
func (m *Models) SetRemote(r Remote) {
	m.mu.Lock()
	m.remote = r
	m.mu.Unlock()
}

// OnCharge registers fn to run (outside the lock) after a charge or an end changes an
// endpoint's ledger: a shared store publishes it.
func (m *Models) OnCharge(fn func(key string)) {
	m.mu.Lock()
	m.onCharge = fn
	m.mu.Unlock()
}

func (m *Models) podLocked(key string, now time.Time) *pod {
	q := m.pods[key]
	if q == nil {
		q = newPod(m.d, now)
		m.pods[key] = q
	}
	return m.usedLocked(q, key, now)
}

// podOfLocked is podLocked(e.Key(), now), read off the endpoint once it was looked up.
func (m *Models) podOfLocked(e *pool.Endpoint, now time.Time) *pod {
	if v, ok := podMemo.Load(e, m, m.gen); ok {
		return m.usedLocked(v.(*pod), e.Key(), now)
	}
	q := m.podLocked(e.Key(), now)
	podMemo.Store(e, m, m.gen, q)
	return q
}

// usedLocked notes that a prediction read q now, and takes the endpoint's newer scraped
// sample, if any.
func (m *Models) usedLocked(q *pod, key string, now time.Time) *pod {
	q.used = now
	// Samples change once a scrape interval: look at most every sampleCheck.
	if m.samples != nil && now.Sub(q.sampleChecked) >= sampleCheck {
		q.sampleChecked = now
		if s := m.samples(key); s != nil && s.UpdatedAt.After(q.sampleAt) {
			q.ingest(s)
		}
	}
	return q
}

// sampleCheck is how often a pod's scraped sample is looked up (scrapes come once a second
// by default).
const sampleCheck = 50 * time.Millisecond

// Prefill predicts, at now, the wait and the prefill seconds of p on the endpoint: the
// prompt's prefill would end wait+service seconds from now.
func (m *Models) Prefill(key string, p Prompt) (wait, service float64) {
	f := m.Forecast(key)
	return f.Wait(), f.Service(p)
}

// PrefillWait predicts, at now, the seconds until the prefill of the route (by its outcome
// record's ID) starts on the endpoint by key: the work booked ahead of it on the ledger, when a
// strategy booked it there (pd-predictive), else the endpoint's predicted wait.
func (m *Models) PrefillWait(id uint64, key string, p Prompt) float64 {
	now := m.clock.Now()
	m.mu.Lock()
	if r := m.routes[id]; r != nil && r.charged && !r.prefillDone && r.prefillOn == key {
		due := r.due.Add(seconds(m.podLocked(key, now).ledger.shift - r.shiftAt))
		m.mu.Unlock()
		return max(due.Sub(now).Seconds()-r.service, 0)
	}
	m.mu.Unlock()
	wait, _ := m.Prefill(key, p)
	return wait
}

// ProofPrefill predicts the prefill seconds of p on the endpoint for the transfer proof: from
// its prefill model when that rests on something it saw (an observed or fitted prefill, or its
// engine's lifetime metrics), else, for a pod no strategy books, from its engine's prefill-time
// histogram (engPrefill); false when neither has learned anything (the defaults prove nothing).
func (m *Models) ProofPrefill(key string, p Prompt) (float64, bool) {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.podLocked(key, now)
	switch {
	case q.prefill.obs > 0 || q.prefillScaled:
		return q.service(p), true
	case q.engPrefill.obs > 0:
		return q.engService(prefillX(p)), true
	}
	return 0, false
}

// Queued reports whether a request sent to the endpoint now would wait for one of its slots:
// its engine reported requests waiting at its latest scrape, or Tandem has more requests on it
// than the engine was seen to run at once.
func (m *Models) Queued(key string) bool {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.podLocked(key, now)
	return q.hasEng && q.engWaiting > 0 || q.slots.n > 0 && float64(q.requests) > q.slots.n
}

// waitLocked is the prefill work ahead of a prompt arriving now: this replica's ledger,
// plus what others booked (the shared store), or, without one, the prompts the engine
// reports waiting beyond those Tandem routed there; w is this replica's ledger (q.backlog at
// now), which the caller has read.
func (m *Models) waitLocked(w float64, key string, q *pod, now time.Time) float64 {
	extra := 0.0
	if m.remote != nil {
		extra = m.remote.Backlog(key, now)
	}
	if !m.noEngine && q.hasEng {
		extra = math.Max(extra, m.unseenLocked(q, now))
	}
	return w + max(extra, 0)
}

// unseenLocked is the wait, beyond the ledger's, for work the engine holds that Tandem did
// not route there: the prompts the engine reported waiting beyond Tandem's, each worth the
// pod's mean prefill, drained since the sample; or, when larger, the mean wait beyond the
// ledger's that the engine's queue-time histogram reported over the last interval. The
// count is a lower bound (it misses a prompt of others in service, and prompts longer than
// Tandem's); the histogram is the recent typical wait, measured whatever the others' prompts
// are (internal/latency/queue_test.go measures both against the true waits).
func (m *Models) unseenLocked(q *pod, now time.Time) float64 {
	unknown := q.unknownWaiting()
	if unknown == 0 { // the usual case: spare the pick the prefill prediction
		return q.queue.unseenWait
	}
	count := unknown*q.service(Prompt{Tokens: int(q.uncached)}) - max(now.Sub(q.sampleAt).Seconds(), 0)
	return math.Max(count, q.queue.unseenWait)
}

// Handover is Forecast(key).Handover.
func (m *Models) Handover(key string, tokens int, after float64) float64 {
	f := m.Forecast(key)
	return f.Handover(tokens, after)
}

// StallRoom is Forecast(key).StallRoom.
func (m *Models) StallRoom(key string) float64 {
	f := m.Forecast(key)
	return f.StallRoom()
}

// StepSeconds predicts the endpoint's decode iteration now.
func (m *Models) StepSeconds(key string) float64 {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.podLocked(key, now)
	return q.stepSeconds(math.Max(float64(q.requests), q.engRunning), math.Max(q.kv, q.engKV))
}

// Delay is Forecast(key).Delay.
func (m *Models) Delay(key string, s float64) float64 {
	f := m.Forecast(key)
	return f.Delay(s)
}

// TPOT is Forecast(key).TPOT.
func (m *Models) TPOT(key string, tokens int, extraPrefill float64) float64 {
	f := m.Forecast(key)
	return f.TPOT(tokens, extraPrefill)
}

// tpotLocked is TPOT under the lock, for the fits.
func (m *Models) tpotLocked(key string, q *pod, now time.Time, tokens int, extraPrefill float64) float64 {
	f := m.forecastLocked(key, q, now)
	return f.TPOT(tokens, extraPrefill)
}

// Charge is what a pick books: the route's kind and endpoints, the prompt as the pod that
// prefills it sees it, the prefill seconds predicted there (Prefill's service), and the
// predicted TTFT and TPOT of the route (0: none), kept to measure the prediction's error.
type Charge struct {
	Kind        outcome.Kind
	Prefill     string // the pod that runs the prompt: the prefill pod, or the destination of a whole route
	Destination string
	Prompt      Prompt
	Service     float64
	TTFT, TPOT  float64
	// TPOTObjective (seconds, 0: none) and MaxTokens (0: unknown) give the request its stall
	// budget while it decodes (StallRoom).
	TPOTObjective float64
	MaxTokens     int
	// Distance is a PD route's pair distance class plus one (0: unknown): the decode pod's
	// hand-over of that class learns from the route's pull.
	Distance int
}

// Charge books a pick on the ledger of the pod that prefills it, under the route's ID
// (outcome.Tracker.ID). Call it right after the route started, inside the pick's
// critical section, so the next pick sees it.
func (m *Models) Charge(id uint64, c Charge) {
	now := m.clock.Now()
	m.mu.Lock()
	r := m.routes[id]
	if r == nil { // no recorder fed the start: count the route here
		r = m.startLocked(id, c.Kind, c.Destination, c.Prompt.Tokens, now)
	}
	q := m.podLocked(c.Prefill, now)
	q.booked++
	if c.Destination != c.Prefill {
		m.podLocked(c.Destination, now).booked++
	}
	r.prefillOn, r.prompt, r.service, r.ttft, r.tpot, r.charged = c.Prefill, c.Prompt, c.Service, c.TTFT, c.TPOT, true
	r.tpotObjective, r.maxTokens = c.TPOTObjective, c.MaxTokens
	r.distance = c.Distance - 1
	q.queue.booked(q.backlog(now))
	r.unseenHist = !m.noEngine && q.hasEng && q.queue.unseenWait > 0
	r.due, r.shiftAt = q.ledger.charge(now, c.Service)
	r.ahead = max(r.due.Sub(now).Seconds()-c.Service, 0)
	r.grace = 0
	if c.Kind == outcome.KindPD && q.directPrefill == 0 {
		// No prefill end was observed on the pod yet: it may be known only from the decode
		// pod's answer, a hand-over later.
		d := m.podLocked(c.Destination, now)
		r.grace = d.handoverSeconds(c.Prompt.Tokens) + d.stepSeconds(max(float64(d.requests), d.engRunning), max(d.kv, d.engKV))
	}
	q.ledger.outstanding = append(q.ledger.outstanding, r)
	if c.Kind == outcome.KindWhole {
		// The prompt stalls the decodes on its pod for about its prefill beyond one step.
		q.slack.stall(math.Max(c.Service-q.stepSeconds(math.Max(float64(q.requests), q.engRunning), math.Max(q.kv, q.engKV)), 0))
	}
	m.podLocked(c.Destination, now).willDecode(r.life, c.TPOTObjective, c.TPOT, c.MaxTokens)
	q.arrived(now)
	if c.Kind == outcome.KindPD && c.Destination != c.Prefill {
		m.podLocked(c.Destination, now).arrived(now)
	}
	q.uncached += 0.05 * (float64(c.Prompt.Tokens-c.Prompt.Cached) - q.uncached)
	fn := m.onCharge
	m.mu.Unlock()
	if fn != nil {
		fn(c.Prefill)
	}
}

func (m *Models) startLocked(id uint64, kind outcome.Kind, dest string, tokens int, at time.Time) *route {
	r := &route{kind: kind, dest: dest, tokens: tokens, distance: -1, picked: at, life: &routeLife{}}
	m.routes[id] = r
	q := m.podLocked(dest, at)
	q.requests++
	q.pending++
	q.kv += float64(tokens)
	return r
}

// Observe implements outcome.Reader: the models learn from every routed request.
func (m *Models) Observe(e *outcome.Event) {
	rt := &e.Route
	m.mu.Lock()
	var changed string
	switch e.Phase {
	case outcome.PhaseStart:
		if m.routes[rt.ID] == nil {
			m.startLocked(rt.ID, rt.Kind, rt.Destination, rt.PromptTokens, rt.Picked)
		}
	case outcome.PhasePrefillEnd:
		changed = m.prefillEndLocked(rt)
	case outcome.PhaseFirstByte:
		changed = m.firstByteLocked(rt)
	case outcome.PhaseProgress:
		m.progressLocked(rt)
	case outcome.PhaseEnd:
		changed = m.endLocked(rt)
	}
	fn := m.onCharge
	m.mu.Unlock()
	if fn != nil && changed != "" {
		fn(changed)
	}
}

// prefillEndLocked: a PD route's prefill leg ended.
func (m *Models) prefillEndLocked(rt *outcome.Route) string {
	r := m.routes[rt.ID]
	if r == nil || !r.charged || r.prefillDone || r.kind != outcome.KindPD {
		return ""
	}
	r.prefillDone = true
	t := rt.PrefillEnd
	q := m.podLocked(r.prefillOn, t)
	if rt.PrefillErr != nil {
		q.ledger.drop(t, r.due, r.shiftAt, r.service)
		return r.prefillOn
	}
	adjust, fit := 0.0, fitObserved
	d := m.podLocked(r.dest, t)
	if rt.PrefillObserved {
		q.directPrefill++
		// The decode leg now waits for the prefill work booked on its pod ahead of it, and
		// for one of its iterations.
		r.destBacklog = d.backlog(t) + m.tpotLocked(r.dest, d, t, r.tokens, 0)
		r.legDue = t.Add(seconds(r.destBacklog + d.handoverSeconds(r.tokens)))
		d.ledger.legs = append(d.ledger.legs, r)
	} else {
		// Inferred from the decode pod's answer: the hand-over is part of it.
		adjust, fit = d.handoverSeconds(r.tokens)+m.tpotLocked(r.dest, d, t, r.tokens, 0), fitInferred
	}
	q.prefillEnded(t, r, fit, adjust)
	return r.prefillOn
}

// firstByteLocked: the destination's first byte. For a whole route it ends the prefill on
// the destination's ledger; for a PD route it times the hand-over. Either way the TTFT
// prediction meets its outcome, and the decode starts.
func (m *Models) firstByteLocked(rt *outcome.Route) string {
	r := m.routes[rt.ID]
	if r == nil {
		return ""
	}
	t := rt.FirstByte
	d := m.podLocked(r.dest, t)
	d.pending = max(d.pending-1, 0)
	r.firstByte = t
	changed := ""
	served := rt.ServedBy() == r.dest
	if !served {
		// A fallback answered (the gateway could not use the destination): the request
		// decodes there, so its count and KV move; the destination's times are not observed.
		d.requests = max(d.requests-1, 0)
		d.kv = math.Max(d.kv-float64(r.tokens), 0)
		r.dest = rt.ServedBy()
		d = m.podLocked(r.dest, t)
		d.requests++
		d.kv += float64(r.tokens)
	}
	switch {
	case r.kind == outcome.KindWhole && r.charged && !r.prefillDone && !served:
		// The prompt never ran where it was booked: give the booking back, as for a failure.
		r.prefillDone = true
		m.podLocked(r.prefillOn, t).ledger.drop(t, r.due, r.shiftAt, r.service)
		changed = r.prefillOn
	case r.kind == outcome.KindWhole && r.charged && !r.prefillDone:
		r.prefillDone = true
		m.podLocked(r.prefillOn, t).prefillEnded(t, r, fitObserved, 0)
		changed = r.prefillOn
	case r.kind == outcome.KindPD && rt.PrefillObserved && !rt.PrefillEnd.IsZero() && served:
		// The hand-over proper: what is left once the decode pod's booked prefill work ahead
		// of the decode leg is taken out.
		obs := t.Sub(rt.PrefillEnd).Seconds() - r.destBacklog
		d.fitHandoverAt(r.distance, r.tokens, obs) // against what the pod predicted before it learns from the pull
		d.fitHandover(r.tokens, obs)
	}
	if r.kind == outcome.KindPD && served {
		d.queue.ownQueued++ // the decode leg left the destination's queue (the engine counts its wait)
	}
	if r.ttft > 0 && served { // a prediction for the destination meets only its own outcome
		obs := rt.TTFT()
		m.errs.add(r.ttft, obs.Seconds())
		ratio := obs.Seconds() / r.ttft
		if ratio > 0 {
			l := math.Log(ratio)
			d.errLog += 0.05 * (l - d.errLog)
			d.errAbs += 0.05 * (math.Abs(l) - d.errAbs)
			d.errN++
		}
		if m.obs != nil {
			m.obs.TTFTPrediction(r.kind.String(), rt.ServedBy(), seconds(r.ttft), obs)
		}
	}
	r.cumAtFirst, r.nAtFirst, r.kvFirst = d.cumWork, float64(d.requests), d.kv
	// The request streams from here on: the pod's progress now includes it.
	d.silence.started(t)
	d.progress(t, 0)
	r.lastChunk = t
	return changed
}

// progressLocked: a later chunk of the route's answer; its destination is making progress.
func (m *Models) progressLocked(rt *outcome.Route) {
	r := m.routes[rt.ID]
	if r == nil || r.firstByte.IsZero() {
		return
	}
	t := rt.LastChunk
	d := m.podLocked(r.dest, t)
	d.progress(t, t.Sub(r.lastChunk))
	r.lastChunk = t
}

// endLocked: the request ended. A decode that streamed fits the destination's step model on
// its mean chunk gap, with the prefill work that shared the pod's iterations meanwhile
// taken out.
func (m *Models) endLocked(rt *outcome.Route) string {
	r := m.routes[rt.ID]
	if r == nil {
		return ""
	}
	delete(m.routes, rt.ID)
	r.life.gone = true
	t := rt.End
	d := m.podLocked(r.dest, t)
	changed := ""
	if r.charged && !r.prefillDone {
		q := m.podLocked(r.prefillOn, t)
		q.ledger.drop(t, r.due, r.shiftAt, r.service)
		changed = r.prefillOn
	}
	if r.firstByte.IsZero() {
		d.pending = max(d.pending-1, 0)
	} else {
		d.silence.ended()
	}
	if rt.Err == nil && !r.firstByte.IsZero() && rt.Chunks >= 3 && rt.ServedBy() == r.dest {
		dur := rt.LastChunk.Sub(r.firstByte).Seconds()
		if dur > 0 {
			rho := math.Min(math.Max((d.cumWork-r.cumAtFirst)/dur, 0), maxRho)
			pure := rt.ChunkGap().Seconds() * (1 - rho)
			n := (r.nAtFirst + float64(d.requests)) / 2
			kv := (r.kvFirst + d.kv) / 2
			d.fitStep(n, kv, pure)
			d.streamSteps++
			d.decodeSecs += 0.05 * (dur - d.decodeSecs)
		}
	}
	d.requests = max(d.requests-1, 0)
	d.kv = math.Max(d.kv-float64(r.tokens), 0)
	return changed
}

// Ingest takes an endpoint's scraped sample (the engine's own view: running and waiting
// requests, KV in use, the prefill-time and inter-token histograms); a sample already taken
// is skipped.
// With Options.Samples the models read samples themselves.
func (m *Models) Ingest(key string, s *metrics.Sample) {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.pods[key]
	if q == nil {
		q = newPod(m.d, m.clock.Now())
		m.pods[key] = q
	}
	if s != nil && s.UpdatedAt.After(q.sampleAt) {
		q.ingest(s)
	}
}

// Forget drops the models of endpoints for which live is false (register it with
// picker.Deps.OnForget), and detaches the routes that counted there: a pod that comes back
// under the same key (a restart) starts from nothing, and the old pod's requests, ending
// later, change nothing on it.
func (m *Models) Forget(live func(key string) bool) {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.pods {
		if !live(k) {
			delete(m.pods, k)
			m.gen++
		}
	}
	for id, r := range m.routes {
		switch {
		case !live(r.dest):
			m.dropRouteLocked(id, r, now)
		case r.prefillOn != "" && !live(r.prefillOn):
			r.prefillDone = true // its booking went with the pod
		}
	}
}

// Sweep forgets the routes whose events stopped coming (lost: no event for routeTTL), with
// what they held: a booking that would keep their prefill pod overdue for ever, a stream the
// silence detector waits on. Run it periodically (ledger.RunJanitor); it implements
// ledger.Sweeper.
func (m *Models) Sweep() {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, r := range m.routes {
		last := r.picked
		if r.lastChunk.After(last) {
			last = r.lastChunk // a long answer still streaming is not forgotten
		}
		if now.Sub(last) > routeTTL {
			m.dropRouteLocked(id, r, now)
		}
	}
}

// dropRouteLocked forgets a route and gives back what it holds on the pods that are still
// modelled: its stream on the destination's silence detector, its booking on the prefill
// pod's ledger.
func (m *Models) dropRouteLocked(id uint64, r *route, now time.Time) {
	delete(m.routes, id)
	r.life.gone = true
	if d := m.pods[r.dest]; d != nil && !r.firstByte.IsZero() {
		d.silence.ended()
	}
	if q := m.pods[r.prefillOn]; q != nil && r.charged && !r.prefillDone {
		r.prefillDone = true
		q.ledger.drop(now, r.due, r.shiftAt, r.service)
	}
}

// PodError is the endpoint's recent TTFT prediction error as a factor (1.25: observed and
// predicted differ by 25 % either way, on a geometric mean) and its bias (observed ÷
// predicted); ok is false before any prediction met its outcome there.
func (m *Models) PodError(key string) (factor, bias float64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.pods[key]
	if q == nil || q.errN == 0 {
		return 0, 0, false
	}
	return math.Exp(q.errAbs), math.Exp(q.errLog), true
}

// Errors summarises every TTFT prediction that met its outcome.
func (m *Models) Errors() ErrorSummary {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.errs.summary()
}

// Coefficients are a pod's fitted models in plain units, for tests and the benchmark.
type Coefficients struct {
	PrefillBase, PrefillPerToken, PrefillQuadratic float64
	HandoverBase, HandoverPerToken                 float64
	StepBase, StepPerRequest, StepPerKVToken       float64
	PrefillObservations, StepObservations          int
}

// ClassHandover is one distance class's fit: the seconds per prompt token its pulls take
// beyond the pod's hand-over model, and the pulls it saw.
type ClassHandover struct {
	ExtraPerToken float64
	Observations  int
}

// Coefficients returns an endpoint's fitted coefficients (the defaults before it was seen).
func (m *Models) Coefficients(key string) Coefficients {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.pods[key]
	if q == nil {
		q = newPod(m.d, m.clock.Now())
	}
	return Coefficients{
		PrefillBase: q.prefill.theta[0], PrefillPerToken: q.prefill.theta[1] / tokScale, PrefillQuadratic: q.prefill.theta[2] / tok2Scale,
		HandoverBase: q.handover.theta[0], HandoverPerToken: q.handover.theta[1] / tokScale,
		StepBase: q.step.theta[0], StepPerRequest: q.step.theta[1] / reqScale, StepPerKVToken: q.step.theta[2] / kvScale,
		PrefillObservations: q.prefill.obs, StepObservations: q.step.obs,
	}
}

// HandoverByDistance is what each pair distance class of an endpoint learned (zero for a
// class never seen), for tests and the benchmark.
func (m *Models) HandoverByDistance(key string) [DistanceClasses]ClassHandover {
	m.mu.Lock()
	defer m.mu.Unlock()
	if q := m.pods[key]; q != nil {
		return q.classHandovers()
	}
	return [DistanceClasses]ClassHandover{}
}

// Local is this replica's booked prefill work on an endpoint at now: the seconds still
// ahead and the charges outstanding (what a shared store publishes).
func (m *Models) Local(key string, now time.Time) (backlog float64, charges int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.pods[key]
	if q == nil {
		return 0, 0
	}
	return q.backlog(now), q.ledger.charges
}

// Keys lists the endpoints with a model.
func (m *Models) Keys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.pods))
	for k := range m.pods {
		out = append(out, k)
	}
	return out
}
