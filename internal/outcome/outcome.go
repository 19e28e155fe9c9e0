package outcome

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
)

// Kind says how a request was routed.
type Kind uint8

const (
	// KindPD: a prefill leg on the Prefill endpoint, then the decode on the Destination.
	KindPD Kind = iota + 1
	// KindWhole: the whole request on the Destination (a standard pod, a decode pod running
	// a prompt itself, or a non-PD strategy's pick).
	KindWhole
)

func (k Kind) String() string {
	switch k {
	case KindPD:
		return "pd"
	case KindWhole:
		return "whole"
	}
	return "unknown"
}

// Phase names an event of a route.
type Phase uint8

const (
	// PhaseStart: the route was decided (published by Recorder.Start).
	PhaseStart Phase = iota + 1
	// PhasePrefillEnd: the prefill leg ended. Observed when the hand-off that ran it reports
	// it (EPP hand-off); inferred when the decode pod starts answering (a decode-side sidecar
	// answers only once its prefill call returned). Route.PrefillObserved tells which.
	PhasePrefillEnd
	// PhaseFirstByte: the first response body byte from the destination arrived.
	PhaseFirstByte
	// PhaseEnd: the request ended, however it ended (Route.Err, Route.Status).
	PhaseEnd
	// PhaseProbe: a scrape or health probe of an endpoint ended (Event.Probe; Route is zero).
	PhaseProbe
	// PhaseProgress: a response body chunk after the first arrived (Route.LastChunk): the
	// destination is still producing the answer.
	PhaseProgress
)

func (p Phase) String() string {
	switch p {
	case PhaseStart:
		return "start"
	case PhasePrefillEnd:
		return "prefill_end"
	case PhaseFirstByte:
		return "first_byte"
	case PhaseEnd:
		return "end"
	case PhaseProbe:
		return "probe"
	case PhaseProgress:
		return "progress"
	}
	return "unknown"
}

// Route is what is known of one routed request after an event. Endpoints are keyed as the
// pool keys them ("namespace/pod:port"); times are the recorder's clock, zero until the
// event happened.
type Route struct {
	ID   uint64
	Kind Kind
	// Prefill is the prefill endpoint ("" for KindWhole); Destination the endpoint picked to
	// answer; Served the one that did, once the response says (a fallback may serve).
	Prefill, Destination, Served string
	// Fallbacks are the endpoints the gateway may try after Destination, in order (set by
	// Tracker.Fallbacks): a route Served by one of them tells a reader the gateway could not
	// connect to those before it.
	Fallbacks    []string
	PromptTokens int
	// CachedTokens are the prompt tokens the pod that prefills it was predicted to hold in
	// its prefix cache at the pick (0 when the strategy does not predict it).
	CachedTokens int

	Picked, PrefillEnd, Headers, FirstByte, LastChunk, End time.Time
	// PrefillObserved: PrefillEnd was reported by the hand-off that ran the leg, not
	// inferred from the decode pod's answer.
	PrefillObserved bool
	PrefillErr      error
	// Status is the destination's response status (0 until its headers arrived).
	Status int
	// Chunks counts response body chunks that carried bytes; Bytes their total.
	Chunks int
	Bytes  int64
	// Err is how the request ended: nil for a completed response.
	Err error
	// Transfer is the proof of a PD route's KV transfer, judged from the decode answer before
	// End (internal/proof: "verified", "recomputed", "unknown"; "" when not judged), and
	// TransferBasis what the verdict rests on ("usage", "timing", "none").
	Transfer, TransferBasis string
}

// TTFT is the time from the pick to the first response byte (0 before it).
func (r *Route) TTFT() time.Duration {
	if r.FirstByte.IsZero() {
		return 0
	}
	return r.FirstByte.Sub(r.Picked)
}

// ChunkGap is the mean time between two response chunks after the first (0 with fewer
// than two chunks): the inter-token latency a streaming client sees.
func (r *Route) ChunkGap() time.Duration {
	if r.Chunks < 2 {
		return 0
	}
	return r.LastChunk.Sub(r.FirstByte) / time.Duration(r.Chunks-1)
}

// Paired reports whether the route is a pair whose prefill leg runs (or ran) on its prefill
// pod: a PD route not served whole (ErrPrefillNotRun).
func (r *Route) Paired() bool {
	return r.Kind == KindPD && !errors.Is(r.PrefillErr, ErrPrefillNotRun)
}

// ServedBy is the endpoint that answered: Served when known, else Destination.
func (r *Route) ServedBy() string {
	if r.Served != "" {
		return r.Served
	}
	return r.Destination
}

// Event is one thing that happened to a route, with the route as it stands after it.
type Event struct {
	Phase Phase
	Route Route
	// Probe is the probe's result for PhaseProbe, nil for route events.
	Probe *Probe
}

// Reader receives every event of every route. Observe runs on the request path: it must be
// quick and must not block; e is valid only during the call.
type Reader interface {
	Observe(e *Event)
}

// Recorder hands the events of routed requests to its readers. Safe for concurrent use; a
// nil *Recorder records nothing.
type Recorder struct {
	clock   load.Clock
	next    atomic.Uint64
	mu      sync.Mutex               // serialises Subscribe
	readers atomic.Pointer[[]Reader] // copy-on-write: Observe never takes a lock
}

// NewRecorder returns a recorder stamping events with clock (the system clock when nil).
func NewRecorder(clock load.Clock) *Recorder {
	if clock == nil {
		clock = load.SystemClock{}
	}
	return &Recorder{clock: clock}
}

// Subscribe adds a reader; it sees the events recorded from now on.
func (r *Recorder) Subscribe(rd Reader) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var cur []Reader
	if p := r.readers.Load(); p != nil {
		cur = *p
	}
	next := append(append(make([]Reader, 0, len(cur)+1), cur...), rd)
	r.readers.Store(&next)
}

// Now is the recorder's clock.
func (r *Recorder) Now() time.Time { return r.clock.Now() }

// Start begins the record of a route decided now: kind, the prefill endpoint ("" unless
// KindPD), the destination and the prompt's token estimate. Report the route's events to
// the returned Tracker. A nil recorder returns a nil Tracker, whose methods do nothing.
func (r *Recorder) Start(kind Kind, prefill, destination string, promptTokens int) *Tracker {
	if r == nil {
		return nil
	}
	t := &Tracker{rec: r, r: Route{ID: r.next.Add(1), Kind: kind, Prefill: prefill, Destination: destination,
		PromptTokens: promptTokens, Picked: r.clock.Now()}}
	r.publish(PhaseStart, &t.r)
	return t
}

func (r *Recorder) publish(p Phase, route *Route) {
	rs := r.readers.Load()
	if rs == nil {
		return
	}
	// An event is valid only during Observe (Reader), so one is reused: a streamed answer
	// publishes one per chunk.
	e := events.Get().(*Event)
	e.Phase, e.Route = p, *route
	for _, rd := range *rs {
		rd.Observe(e)
	}
	*e = Event{} // hold no request's data while pooled
	events.Put(e)
}

var events = sync.Pool{New: func() any { return new(Event) }}

// Tracker is the writer side of one route: the decision's lifecycle reports to it, and the
// ext_proc server reports first what it knows better (how the prefill leg and the request
// ended, classified; the endpoint that served). Every method is safe for concurrent use,
// records its event once (the first report wins), and ignores events after End. Methods on a
// nil Tracker do nothing.
type Tracker struct {
	rec   *Recorder
	mu    sync.Mutex
	r     Route
	ended bool
	// legReported: the prefill leg's end will be reported by what runs it (ReportsLeg).
	legReported bool
}

// ID is the route's identifier, unique in the process (0 for a nil Tracker): what a
// reader that charged something at pick time keys it by.
func (t *Tracker) ID() uint64 {
	if t == nil {
		return 0
	}
	return t.r.ID // set once in Start
}

// PrefillEnd reports the end of the prefill leg: observed when the hand-off that ran it
// says so, else inferred (the decode pod is answering). Only the first report counts.
func (t *Tracker) PrefillEnd(err error, observed bool) {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.ended || !t.r.PrefillEnd.IsZero() || t.r.Kind != KindPD {
		t.mu.Unlock()
		return
	}
	t.r.PrefillEnd, t.r.PrefillErr, t.r.PrefillObserved = t.rec.clock.Now(), err, observed
	r := t.r
	t.mu.Unlock()
	t.rec.publish(PhasePrefillEnd, &r)
}

// ReportsLeg says the prefill leg's end will be reported by what runs it (an EPP hand-off,
// through PrefillEnd), so Answered does not infer it: an asynchronous leg may still be running
// when the decode pod answers.
func (t *Tracker) ReportsLeg() {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.legReported = true
	t.mu.Unlock()
}

// Answered reports the destination's response headers (Response) with what they say of a PD
// route's prefill leg when nothing reported its end yet and nothing will (ReportsLeg): a
// decode-side sidecar answers only once its prefill call returned, so the leg has ended
// (inferred, not observed); an endpoint that served the request whole (ranWhole: a combined
// fallback) ran the prompt itself, so no leg ran (ErrPrefillNotRun).
func (t *Tracker) Answered(status int, served string, ranWhole bool) {
	if t == nil {
		return
	}
	t.mu.Lock()
	reported := t.legReported
	t.mu.Unlock()
	if !reported {
		var leg error
		if ranWhole {
			leg = ErrPrefillNotRun
		}
		t.PrefillEnd(leg, false)
	}
	t.Response(status, served)
}

// Response reports the destination's response headers: its status and the endpoint key
// that served ("" when the gateway did not say).
func (t *Tracker) Response(status int, served string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	if !t.ended && t.r.Headers.IsZero() {
		t.r.Headers, t.r.Status = t.rec.clock.Now(), status
		if served != "" {
			t.r.Served = served
		}
	}
	t.mu.Unlock()
}

// Cached records the prompt tokens the prefilling pod was predicted to hold in its prefix
// cache (set at the pick; no event).
func (t *Tracker) Cached(tokens int) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.r.CachedTokens = max(tokens, 0)
	t.mu.Unlock()
}

// Chunk reports a response body chunk of size bytes; the first that carries bytes is the
// first byte (PhaseFirstByte), every later one progress (PhaseProgress).
func (t *Tracker) Chunk(size int) {
	if t == nil || size <= 0 {
		return
	}
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return
	}
	now := t.rec.clock.Now()
	t.r.Chunks++
	t.r.Bytes += int64(size)
	t.r.LastChunk = now
	phase := PhaseProgress
	if t.r.FirstByte.IsZero() {
		t.r.FirstByte = now
		phase = PhaseFirstByte
	}
	r := t.r
	t.mu.Unlock()
	t.rec.publish(phase, &r)
}

// Transfer records the proof of a PD route's KV transfer (no event: readers see it with End).
// Only the first report counts.
func (t *Tracker) Transfer(result, basis string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	if !t.ended && t.r.Transfer == "" && t.r.Kind == KindPD {
		t.r.Transfer, t.r.TransferBasis = result, basis
	}
	t.mu.Unlock()
}

// End reports how the request ended (nil: completed). Later reports are ignored.
func (t *Tracker) End(err error) {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return
	}
	t.ended = true
	t.r.End, t.r.Err = t.rec.clock.Now(), err
	r := t.r
	t.mu.Unlock()
	t.rec.publish(PhaseEnd, &r)
}
