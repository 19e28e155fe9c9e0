package proof

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/outcome"
)

// The lenient policy: a decode pod whose PD transfers keep recomputing (HoldAfter of its last
// Window verdicts) is held out of every pick, as an unhealthy pair member: its requests go to
// other pairs or the standard path. After the back-off it is a candidate again, on trial: the
// first request picked for it is its trial (TrialStarted), and it is held again until that
// request's verdict comes back (at most trialWait): verified returns it, recomputed holds it
// again for twice as long (at most MaxBackoff), and an unknown one (or none) lets the next
// request try. Unknown verdicts change nothing else.

// Defaults of GateOptions.
const (
	DefaultWindow     = 3
	DefaultHoldAfter  = 2
	DefaultBackoff    = 30 * time.Second
	DefaultMaxBackoff = 5 * time.Minute
)

// Observer receives what the metrics count; it must be quick and safe for concurrent use.
type Observer interface {
	// Transfer counts one PD request's verdict for its pod pair ("namespace/name" keys).
	Transfer(result Result, prefillPod, decodePod string)
}

// GateOptions configure a Gate; zero fields take the defaults.
type GateOptions struct {
	Window, HoldAfter   int
	Backoff, MaxBackoff time.Duration
	Now                 func() time.Time
	Observer            Observer
	Logger              logr.Logger
	// InPool tells whether an endpoint is in the pool now: a verdict or leg sample that comes
	// after its pod left is dropped rather than bringing its state back. Nil: every endpoint is.
	InPool func(key string) bool
}

// Gate is the per decode pod state of the proof: its recent verdicts, whether its engine counts
// transferred KV as cached tokens, and whether it is held out. It reads the requests' outcome
// records (Observe); Held is called on every pick and reads an atomic snapshot. Safe for concurrent use.
type Gate struct {
	o    GateOptions
	mu   sync.Mutex
	pods map[string]*podState // by endpoint key
	held atomic.Pointer[map[string]time.Time]
	// counts: endpoint keys (and "model\x00"+model) whose answers verified a transfer by usage.
	counts sync.Map
	// forgotAt: when Forget dropped a pod's state (under mu), so that a verdict on a request
	// picked before then (the pod that left, or the one a restart replaced) does not judge a pod
	// back under the same key. Entries older than forgetMemory are dropped.
	forgotAt map[string]time.Time
	// legs: per prefill pod, its recent requests behind a decode-side sidecar, newest last
	// (under mu).
	legs map[string][]LegSample
}

// LegSample is one request behind a decode-side sidecar: its decode pod, its prompt, the wait
// predicted on the prefill pod when it was forwarded, and its first token's time from then.
// How late that was (Evidence.Late) is worked out when it is read, with what the models know
// of the prefill pod then.
type LegSample struct {
	Decode          string
	Tokens          int
	Wait, FirstByte time.Duration
	at              time.Time
}

// Peer lateness: the samples kept per prefill pod, and how long one counts.
const (
	maxLegSamples = 32
	legWindow     = 5 * time.Second // the load a request met is the load of its neighbours
)

type podState struct {
	recent  []Result // the last verified or recomputed verdicts, oldest first
	held    bool
	until   time.Time // the back-off's end: from then on, on trial
	backoff time.Duration
	// trialUntil: a trial request was picked; the pod is held until its verdict comes, or
	// until then (trialWait after the pick), when another may be.
	trialUntil time.Time
}

// trialWait is how long a held pod's trial request may take to be judged before another
// request is let through as a trial (its verdict may never come: an unknown one, a failure).
const trialWait = time.Minute

// NewGate returns a gate with o's settings.
func NewGate(o GateOptions) *Gate {
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.HoldAfter <= 0 || o.HoldAfter > o.Window {
		o.HoldAfter = min(DefaultHoldAfter, o.Window)
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = max(DefaultMaxBackoff, o.Backoff)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	g := &Gate{o: o, pods: map[string]*podState{}, legs: map[string][]LegSample{}, forgotAt: map[string]time.Time{}}
	g.held.Store(&map[string]time.Time{})
	return g
}

// Held reports whether the decode endpoint (by key) is held out of picks now: it recomputed,
// and its back-off has not passed (after it, the endpoint is on trial and admitted). A nil
// Gate holds nothing.
func (g *Gate) Held(key string) bool {
	if g == nil {
		return false
	}
	until, ok := (*g.held.Load())[key]
	return ok && g.o.Now().Before(until)
}

// CountsTransfers reports whether the endpoint, or another pod of the same group, has
// reported a PD transfer's KV among its cached tokens (SawTransfer): pods of one group (one
// model and revision, EngineGroup) are taken to run one engine with one set of flags, so a pod
// broken from its start, which never verifies, is still judged by its usage; a new revision,
// which may run another engine or other flags, earns it anew.
func (g *Gate) CountsTransfers(key, model string) bool {
	if g == nil {
		return false
	}
	_, ok := g.counts.Load(key)
	if !ok && model != "" {
		_, ok = g.counts.Load("model\x00" + model)
	}
	return ok
}

// EngineGroup is the group CountsTransfers and SawTransfer take for an endpoint of the model
// whose pair-match labels read revision (pool.Endpoint.Revision).
func EngineGroup(model, revision string) string {
	if revision == "" {
		return model
	}
	return model + "@" + revision
}

// SawTransfer records that the endpoint's answer counted its PD transfer's KV as cached
// tokens: a transfer verified by usage whose cached tokens cover the whole prompt
// (Usage.WholePrompt).
func (g *Gate) SawTransfer(key, model string) {
	if g != nil {
		g.counts.Store(key, struct{}{})
		if model != "" {
			g.counts.Store("model\x00"+model, struct{}{})
		}
	}
}

// forgetMemory is how long the gate remembers when it forgot a pod: longer than a request
// picked before then is expected to run.
const forgetMemory = 15 * time.Minute

// Forget drops the state of the decode endpoints live says have left the pool or were replaced
// (register it with picker.Deps.OnForget). Whether a model's engine counts transfers is kept.
func (g *Gate) Forget(live func(key string) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.o.Now()
	for k, at := range g.forgotAt {
		if now.Sub(at) > forgetMemory {
			delete(g.forgotAt, k)
		}
	}
	gone := false
	for k := range g.pods {
		if !live(k) {
			delete(g.pods, k)
			g.forgotAt[k] = now
			gone = true
		}
	}
	for p, ls := range g.legs {
		if !live(p) {
			delete(g.legs, p)
			continue
		}
		g.legs[p] = slices.DeleteFunc(ls, func(l LegSample) bool { return !live(l.Decode) })
	}
	g.counts.Range(func(k, _ any) bool {
		if key := k.(string); !strings.HasPrefix(key, "model\x00") && !live(key) {
			g.counts.Delete(k)
		}
		return true
	})
	if gone {
		g.publishLocked()
	}
}

// TrialStarted records that a pick chose the decode endpoint while it was on trial (held, its
// back-off over): it is held again until that request's verdict comes (at most trialWait), so
// one request, not its full share, tries it. Call it after every pick with the chosen decode
// endpoint; it is cheap for one not held.
func (g *Gate) TrialStarted(key string) {
	if g == nil {
		return
	}
	if _, ok := (*g.held.Load())[key]; !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.o.Now()
	if st := g.pods[key]; st != nil && st.held && !now.Before(st.until) && !now.Before(st.trialUntil) {
		st.trialUntil = now.Add(trialWait)
		g.publishLocked()
	}
}

// trialUndecided takes a held pod's request whose transfer was judged neither way: when it
// was the trial (picked once the back-off was over), another request may try.
func (g *Gate) trialUndecided(key string, picked time.Time) {
	if _, ok := (*g.held.Load())[key]; !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.pods[key]; st != nil && st.held && !st.trialUntil.IsZero() && !picked.Before(st.until) {
		st.trialUntil = time.Time{}
		g.publishLocked()
	}
}

// Observe implements outcome.Reader: the verdict of every ended PD route.
func (g *Gate) Observe(e *outcome.Event) {
	r := &e.Route
	if e.Phase != outcome.PhaseEnd || !r.Paired() {
		return // no KV transfer to prove: not a pair, or routed whole
	}
	decode := r.ServedBy()
	if res := Result(r.Transfer); res != Verified && res != Recomputed {
		g.trialUndecided(decode, r.Picked) // unknown, or never judged (a failure)
		if r.Transfer == "" {
			return
		}
	}
	if g.o.Observer != nil {
		g.o.Observer.Transfer(Result(r.Transfer), podOf(r.Prefill), podOf(decode))
	}
	g.RecordPicked(decode, Result(r.Transfer), r.Picked)
}

// podOf is the "namespace/name" of an endpoint key "namespace/name:port".
func podOf(key string) string {
	if i := strings.LastIndexByte(key, ':'); i > strings.LastIndexByte(key, '/') {
		return key[:i]
	}
	return key
}

// Record takes one verdict on a decode endpoint's transfer, of a request picked now.
func (g *Gate) Record(key string, res Result) { g.RecordPicked(key, res, time.Time{}) }

// RecordPicked takes one verdict on a decode endpoint's transfer, of a request picked at
// picked (zero: now). Only a request picked once the back-off was over is a held pod's trial.
func (g *Gate) RecordPicked(key string, res Result, picked time.Time) {
	if res != Verified && res != Recomputed {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.o.Now()
	st := g.pods[key]
	if st == nil && g.o.InPool != nil && !g.o.InPool(key) {
		return // a verdict that came after its pod left the pool
	}
	if at, ok := g.forgotAt[key]; ok && !picked.IsZero() && picked.Before(at) {
		return // a request of the pod that was forgotten, not of the one there now
	}
	if st == nil {
		st = &podState{}
		g.pods[key] = st
	}
	if picked.IsZero() {
		picked = now
	}
	if st.held {
		if picked.Before(st.until) {
			return // a request picked before the back-off ended: its verdict is no trial
		}
		if res == Verified {
			st.held, st.recent, st.backoff, st.trialUntil = false, nil, 0, time.Time{}
			g.o.Logger.Info("decode pod verified its KV transfer again; it receives PD work again", "decode", key)
			g.publishLocked()
			return
		}
		st.backoff = min(2*st.backoff, g.o.MaxBackoff)
		st.until, st.trialUntil = now.Add(st.backoff), time.Time{}
		g.o.Logger.Info("decode pod recomputed the prompt on its trial request; held out again", "decode", key, "for", st.backoff.String())
		g.publishLocked()
		return
	}
	st.recent = append(st.recent, res)
	if len(st.recent) > g.o.Window {
		st.recent = st.recent[len(st.recent)-g.o.Window:]
	}
	n := 0
	for _, r := range st.recent {
		if r == Recomputed {
			n++
		}
	}
	if n < g.o.HoldAfter {
		return
	}
	st.held, st.backoff = true, g.o.Backoff
	st.until = now.Add(st.backoff)
	g.o.Logger.Info("WARNING: decode pod keeps recomputing the prompt instead of using the transferred KV (broken KV connector, wrong KV port or version skew?); it receives no work until a trial request verifies",
		"decode", key, "recomputed", n, "of", len(st.recent), "for", st.backoff.String())
	g.publishLocked()
}

// AddLeg records a request from the prefill pod behind a decode-side sidecar.
func (g *Gate) AddLeg(prefill string, l LegSample) {
	if g == nil || prefill == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.o.InPool != nil && !g.o.InPool(prefill) {
		return
	}
	l.at = g.o.Now()
	ls := append(g.legs[prefill], l)
	if len(ls) > maxLegSamples {
		ls = slices.Delete(ls, 0, len(ls)-maxLegSamples)
	}
	g.legs[prefill] = ls
}

// PeerLate is the median lateness (late: false when it cannot be told) of the prefill pod's
// requests to decode pods other than decode within the last legWindow; false with none.
func (g *Gate) PeerLate(prefill, decode string, late func(LegSample) (float64, bool)) (float64, bool) {
	if g == nil {
		return 0, false
	}
	g.mu.Lock()
	since := g.o.Now().Add(-legWindow)
	var peers []LegSample
	for _, l := range g.legs[prefill] {
		if l.Decode != decode && l.at.After(since) {
			peers = append(peers, l)
		}
	}
	g.mu.Unlock()
	var xs []float64
	for _, l := range peers {
		if x, ok := late(l); ok {
			xs = append(xs, x)
		}
	}
	if len(xs) == 0 {
		return 0, false
	}
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2, true
	}
	return xs[len(xs)/2], true
}

func (g *Gate) publishLocked() {
	m := make(map[string]time.Time, len(g.pods))
	for k, st := range g.pods {
		if st.held {
			m[k] = st.until
			if st.trialUntil.After(st.until) {
				m[k] = st.trialUntil
			}
		}
	}
	g.held.Store(&m)
}
