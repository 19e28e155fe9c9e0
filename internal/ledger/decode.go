package ledger

import (
	"sync"
	"sync/atomic"
	"time"
)

// Decode is the decode token ledger of the token_load decode policy: per decode pod, the
// prompt tokens of its outstanding requests, their count and the sum of their charge times,
// so the output generated since routing (rate × Σ(now − routed_at)) is O(1) per pod:
// rate × (count·now − Σ routed_at). Charges, releases and reads of a pod's numbers serialise
// on one mutex (a read holds it only to copy them). A Remote adds other gateway replicas'
// charges to Load.
type Decode struct {
	o    Options
	base time.Time // charge times are seconds since base, so sums keep their precision
	mu   sync.Mutex
	pods *podTable[decodePod]
	open map[*DecodeCharge]struct{}

	remote   atomic.Pointer[remoteBox]
	onChange atomic.Pointer[func(Pod)]
}

type decodePod struct {
	tokens  atomicFloat
	count   atomic.Int64
	sumAt   atomicFloat // Σ charge time, seconds since Decode.base
	touched time.Time   // guarded by Decode.mu
}

// RemoteLoad is what other replicas hold on a decode pod: their prompt tokens, how many
// requests, and Σ(now − routed_at) over those requests in seconds at the time it was read.
type RemoteLoad struct {
	Tokens  float64
	Count   int64
	Elapsed float64
}

// Remote supplies other replicas' charges (redisledger implements it). Remote must be
// cheap and must not block: it is read inside the selection critical section.
type Remote interface {
	Remote(p Pod) RemoteLoad
}

type remoteBox struct{ r Remote }

// NewDecode returns an empty decode ledger.
func NewDecode(o Options) *Decode {
	o = o.withDefaults()
	return &Decode{o: o, base: o.Clock.Now(), pods: newPodTable[decodePod](), open: map[*DecodeCharge]struct{}{}}
}

// SetRemote makes Load add r's view of other replicas (nil: local only).
func (l *Decode) SetRemote(r Remote) {
	if r == nil {
		l.remote.Store(nil)
		return
	}
	l.remote.Store(&remoteBox{r})
}

// OnChange registers f to be told (outside the lock, never concurrently with itself for
// one call) which pod's ledger changed, so a shared store can publish it. f must not block.
func (l *Decode) OnChange(f func(Pod)) {
	if f == nil {
		l.onChange.Store(nil)
		return
	}
	l.onChange.Store(&f)
}

func (l *Decode) changed(p Pod) {
	if f := l.onChange.Load(); f != nil {
		(*f)(p)
	}
}

// DecodeCharge is one request's charge on a decode pod. Release is idempotent.
type DecodeCharge struct {
	l        *Decode
	pod      Pod
	tokens   float64
	at       float64 // seconds since l.base
	deadline time.Time
	held     bool // guarded by l.mu
}

func (l *Decode) seconds(t time.Time) float64 { return t.Sub(l.base).Seconds() }

// Acquire charges a request's prompt tokens to the decode pod, routed now. A charge still
// held after ttl is force-released by Sweep with a warning (ttl ≤ 0: never).
func (l *Decode) Acquire(p Pod, tokens float64, ttl time.Duration) *DecodeCharge {
	now := l.o.Clock.Now()
	c := &DecodeCharge{l: l, pod: p, tokens: tokens, at: l.seconds(now), held: true}
	if ttl > 0 {
		c.deadline = now.Add(ttl)
	}
	l.mu.Lock()
	e := l.pods.getOrAdd(p)
	e.touched = now
	e.count.Add(1)
	e.sumAt.add(c.at)
	l.open[c] = struct{}{}
	l.o.Gauges.SetDecodeTokens(p.Namespace, p.Name, e.tokens.add(tokens))
	l.mu.Unlock()
	l.changed(p)
	return c
}

// Pod is the pod charged.
func (c *DecodeCharge) Pod() Pod { return c.pod }

// Release releases the charge: the request completed, or its prefill failed terminally.
func (c *DecodeCharge) Release() {
	l := c.l
	l.mu.Lock()
	done := c.releaseLocked(l.o.Clock.Now())
	l.mu.Unlock()
	if done {
		l.changed(c.pod)
	}
}

func (c *DecodeCharge) releaseLocked(now time.Time) bool {
	if !c.held {
		return false
	}
	l := c.l
	c.held = false
	delete(l.open, c)
	e := l.pods.get(c.pod)
	if e == nil {
		return false
	}
	if e.count.Add(-1) <= 0 {
		// Exactly zero once the last charge goes, whatever float rounding left behind.
		e.count.Store(0)
		e.sumAt.Store(0)
		e.tokens.Store(0)
	} else {
		e.sumAt.add(-c.at)
		e.tokens.add(-c.tokens)
	}
	e.touched = now
	l.o.Gauges.SetDecodeTokens(c.pod.Namespace, c.pod.Name, e.tokens.Load())
	return true
}

// Local is this replica's ledger of a pod: prompt tokens, outstanding requests, and
// Σ(now − routed_at) in seconds.
//
// The three fields are read under the ledger's mutex: a release (from a request's Done,
// outside the selection critical section) updates count, Σ routed_at and tokens one after
// the other, and a read between them would pair the old count with the new sum, adding
// the released charge's routed_at — about the ledger's age in seconds — to elapsed.
func (l *Decode) Local(p Pod) (tokens float64, count int64, elapsed float64) {
	e := l.pods.get(p)
	if e == nil {
		return 0, 0, 0
	}
	now := l.seconds(l.o.Clock.Now())
	l.mu.Lock()
	tokens, n, sumAt := e.tokens.Load(), e.count.Load(), e.sumAt.Load()
	l.mu.Unlock()
	if n == 0 {
		return tokens, 0, 0
	}
	return tokens, n, max(float64(n)*now-sumAt, 0)
}

// Load is the token_load decode score of a pod: decode_tokens + generated_tokens, where
// decode_tokens is the prompt tokens charged to it (here and, with a Remote, by the other
// live replicas) and generated_tokens = rate × Σ(now − routed_at) over the same requests
// when growth is on. rate is the pod's per-request generation rate in tokens/s.
func (l *Decode) Load(p Pod, rate float64, growth bool) float64 {
	tokens, _, elapsed := l.Local(p)
	if b := l.remote.Load(); b != nil {
		r := b.r.Remote(p)
		tokens += r.Tokens
		elapsed += r.Elapsed
	}
	if growth && rate > 0 {
		return tokens + rate*elapsed
	}
	return tokens
}

// Pods lists the pods the ledger holds.
func (l *Decode) Pods() []Pod { return l.pods.pods() }

// Open is the number of charges not released.
func (l *Decode) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.open)
}

// Sweep is the janitor's pass: force-release charges past their TTL (logged as warnings)
// and forget pods at zero untouched for IdleAfter, with their gauge series.
func (l *Decode) Sweep() {
	now := l.o.Clock.Now()
	var exp []expired
	var changed []Pod
	l.mu.Lock()
	for c := range l.open {
		if !c.deadline.IsZero() && !now.Before(c.deadline) {
			exp = append(exp, expired{c.pod, c.tokens, time.Duration((l.seconds(now) - c.at) * float64(time.Second))})
			if c.releaseLocked(now) {
				changed = append(changed, c.pod)
			}
		}
	}
	l.pods.dropIdle(func(e *decodePod) bool {
		return e.count.Load() == 0 && now.Sub(e.touched) >= IdleAfter
	}, l.o.Gauges)
	l.mu.Unlock()
	for _, p := range changed {
		l.changed(p)
	}
	logExpired(l.o.Logger, "decode", exp)
}
