package latency

import (
	"math"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

// Forecast is one endpoint's models as read at one instant: every prediction a pick makes
// about the endpoint reads it without a lock (a pick reads each candidate once).
type Forecast struct {
	valid bool
	// backlog is this replica's booked prefill work ahead now; wait adds what other
	// replicas booked (a shared store) or the engine reports beyond it; slotWait is the wait
	// for a running slot (the engine's max-num-seqs), which is no prefill work: it lengthens
	// a new request's wait (Wait, Handover), not the prefill load its decodes or later
	// prompts see (TPOT, Delay).
	backlog, wait, slotWait float64
	prefill                 [3]float64 // coefficients, each at least 0
	handover                [2]float64
	// byDistance: the extra hand-over seconds per tokScale prompt tokens of the distance
	// classes set in learned.
	byDistance [DistanceClasses]float64
	learned    uint8
	step       [3]float64
	// n and kv are the requests and KV tokens on the pod (the larger of Tandem's count and
	// the engine's); rho the recent prefill load; h how long a request decodes there.
	n, kv, rho, h float64
	arrivals      float64 // routes queueing on the pod per second, recently
	stallRoom     float64
}

// Valid reports whether f was read from the models (the zero Forecast is not).
func (f *Forecast) Valid() bool { return f.valid }

// Forecast reads an endpoint's models now.
func (m *Models) Forecast(key string) Forecast {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.forecastLocked(key, m.podLocked(key, now), now)
}

// ForecastEndpoints reads the models of the n endpoints at(0) … at(n-1) at one instant and
// under one lock into out[:n], each endpoint's models found off the endpoint (no key lookup)
// after the first pick that read them.
func (m *Models) ForecastEndpoints(n int, at func(i int) *pool.Endpoint, out []Forecast) {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := 0; i < n; i++ {
		e := at(i)
		m.readLocked(&out[i], e.Key(), m.podOfLocked(e, now), now)
	}
}

// ForecastOf is Forecast(e.Key()), the models found off the endpoint.
func (m *Models) ForecastOf(e *pool.Endpoint) Forecast {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.forecastLocked(e.Key(), m.podOfLocked(e, now), now)
}

func (m *Models) forecastLocked(key string, q *pod, now time.Time) Forecast {
	var f Forecast
	m.readLocked(&f, key, q, now)
	return f
}

// readLocked fills f from the pod's models at now, in place (a batch's forecasts are
// written where they are kept, not copied there).
func (m *Models) readLocked(f *Forecast, key string, q *pod, now time.Time) {
	backlog := q.backlog(now)
	f.slotWait = q.slotWait()
	f.valid, f.backlog, f.wait = true, backlog, m.waitLocked(backlog, key, q, now)
	f.n, f.kv = max(float64(q.requests), q.engRunning), max(q.kv, q.engKV)
	f.rho, f.h, f.arrivals = q.rhoAtNow(now), max(q.decodeSecs, minDecodeSecs), q.arrivalRate(now)
	f.stallRoom = q.slack.room()
	for i := range f.prefill {
		f.prefill[i] = max(q.prefill.theta[i], 0)
		f.step[i] = max(q.step.theta[i], 0)
	}
	for i := range f.handover {
		f.handover[i] = max(q.handover.theta[i], 0)
	}
	f.readClasses(q)
}

// Wait is the prefill work ahead of a prompt arriving now, or its wait for a running slot
// when that is longer, in seconds.
func (f *Forecast) Wait() float64 { return max(f.wait, f.slotWait) }

// Service is the predicted prefill seconds of p.
func (f *Forecast) Service(p Prompt) float64 {
	x := prefillX(p)
	return max(f.prefill[0]*x[0]+f.prefill[1]*x[1]+f.prefill[2]*x[2], minService)
}

// Step is the predicted decode iteration at the pod's requests and KV tokens plus a request
// of tokens prompt tokens.
func (f *Forecast) Step(tokens int) float64 {
	x := stepX(f.n+1, f.kv+float64(tokens))
	return max(f.step[0]*x[0]+f.step[1]*x[1]+f.step[2]*x[2], minStep)
}

// TPOT predicts the time per output token there of a request of tokens prompt tokens (and
// of the requests already there) if extraPrefill seconds of prefill work were added now:
// the decode step stretched by the share of the pod's time prefill work is predicted to
// take while it decodes.
func (f *Forecast) TPOT(tokens int, extraPrefill float64) float64 {
	rho := math.Max(f.rho, f.wait/f.h) + max(extraPrefill, 0)/f.h
	return f.Step(tokens) / (1 - min(max(rho, 0), maxRho))
}

// Handover predicts the seconds from the end of a prefill of tokens elsewhere, after
// seconds from now, to the pod's first byte: the prefill work booked on the pod still ahead
// then (its decode leg queues behind it) or the wait for a running slot, whichever is longer,
// the KV transfer, and one decode iteration.
func (f *Forecast) Handover(tokens int, after float64) float64 {
	_, h := f.TPOTAndHandover(tokens, after)
	return h
}

// TPOTAndHandover is TPOT(tokens, 0) and Handover(tokens, after), the TPOT computed once.
func (f *Forecast) TPOTAndHandover(tokens int, after float64) (tpot, handover float64) {
	tpot = f.TPOT(tokens, 0)
	return tpot, max(max(f.backlog, f.slotWait)-max(after, 0), 0) + f.transfer(tokens) + tpot
}

// Delay predicts what booking s seconds of prefill on the pod now costs the routes that will
// queue behind it: s for each that arrives before the pod works through its booked work
// and this one (the recent arrival rate × that time).
func (f *Forecast) Delay(s float64) float64 { return f.arrivals * (f.wait + s) * s }

// StallRoom is how many seconds of stall the requests decoding on the pod can still absorb
// before the tightest of them misses its TPOT objective (+Inf when none decodes there).
func (f *Forecast) StallRoom() float64 { return f.stallRoom }
