package ledger

import (
	"sync"
	"time"
)

// IdleAfter is how long a pod must sit at zero load, untouched, before the janitor forgets
// it and deletes its gauge series; the next charge re-creates it from zero.
const IdleAfter = time.Minute

// Prefill is the prefill token ledger: per pod, active tokens (prefill calls not yet
// returned) and kv tokens (requests not yet complete, their KV still resident). Each charge
// adds its tokens to both. Reads are lock-free; charges and releases serialise on one mutex,
// so a charge made in the selection critical section is seen by the next selection.
type Prefill struct {
	o    Options
	mu   sync.Mutex
	pods *podTable[prefillPod]
	open map[*PrefillCharge]struct{}
}

type prefillPod struct {
	active, kv atomicFloat
	// Charges holding each part, guarded by Prefill.mu: a part with none left is set to
	// exactly zero, whatever float rounding of fractional charges left behind.
	nActive, nKV int
	touched      time.Time // guarded by Prefill.mu
}

// NewPrefill returns an empty prefill ledger.
func NewPrefill(o Options) *Prefill {
	return &Prefill{o: o.withDefaults(), pods: newPodTable[prefillPod](), open: map[*PrefillCharge]struct{}{}}
}

// PrefillCharge is one request's charge on a prefill pod. Its releases are idempotent and
// safe to call from any goroutine.
type PrefillCharge struct {
	l        *Prefill
	pod      Pod
	tokens   float64
	at       time.Time
	deadline time.Time
	active   bool // guarded by l.mu: the active part is still held
	kv       bool // guarded by l.mu: the kv part is still held
}

// Acquire charges tokens to the pod's active and kv counters. A charge still held after ttl
// is force-released by Sweep with a warning (ttl ≤ 0: never).
func (l *Prefill) Acquire(p Pod, tokens float64, ttl time.Duration) *PrefillCharge {
	now := l.o.Clock.Now()
	c := &PrefillCharge{l: l, pod: p, tokens: tokens, at: now, active: true, kv: true}
	if ttl > 0 {
		c.deadline = now.Add(ttl)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.pods.getOrAdd(p)
	e.touched = now
	e.nActive++
	e.nKV++
	l.open[c] = struct{}{}
	l.o.Gauges.SetTokenLoad(p.Namespace, p.Name, e.active.add(tokens), e.kv.add(tokens))
	return c
}

// Pod is the pod charged.
func (c *PrefillCharge) Pod() Pod { return c.pod }

// Tokens is the size of the charge.
func (c *PrefillCharge) Tokens() float64 { return c.tokens }

// ReleaseActive releases the active part: the prefill leg returned (or, with a sidecar
// hand-off, the decode leg's first response byte arrived).
func (c *PrefillCharge) ReleaseActive() { c.release(true, false) }

// ReleaseKV releases the kv part: the request completed.
func (c *PrefillCharge) ReleaseKV() { c.release(false, true) }

// ReleaseAll releases both parts: the prefill leg failed, or the request ended.
func (c *PrefillCharge) ReleaseAll() { c.release(true, true) }

func (c *PrefillCharge) release(active, kv bool) {
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	c.releaseLocked(active, kv, l.o.Clock.Now())
}

func (c *PrefillCharge) releaseLocked(active, kv bool, now time.Time) {
	l := c.l
	active, kv = active && c.active, kv && c.kv
	if !active && !kv {
		return
	}
	if active {
		c.active = false
	}
	if kv {
		c.kv = false
	}
	if !c.active && !c.kv {
		delete(l.open, c)
	}
	e := l.pods.get(c.pod)
	if e == nil {
		return
	}
	if active {
		releasePart(&e.active, &e.nActive, c.tokens)
	}
	if kv {
		releasePart(&e.kv, &e.nKV, c.tokens)
	}
	e.touched = now
	l.o.Gauges.SetTokenLoad(c.pod.Namespace, c.pod.Name, e.active.Load(), e.kv.Load())
}

// Load returns the pod's active and kv tokens (zero for a pod never charged).
func (l *Prefill) Load(p Pod) (active, kv float64) {
	if e := l.pods.get(p); e != nil {
		return e.active.Load(), e.kv.Load()
	}
	return 0, 0
}

// Pods lists the pods the ledger holds.
func (l *Prefill) Pods() []Pod { return l.pods.pods() }

// Open is the number of charges not fully released.
func (l *Prefill) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.open)
}

// Sweep is the janitor's pass: it force-releases charges past their TTL (logging each
// as a warning) and forgets pods at zero load untouched for IdleAfter, with their series.
func (l *Prefill) Sweep() {
	now := l.o.Clock.Now()
	var exp []expired
	l.mu.Lock()
	for c := range l.open {
		if !c.deadline.IsZero() && !now.Before(c.deadline) {
			exp = append(exp, expired{c.pod, c.tokens, now.Sub(c.at)})
			c.releaseLocked(true, true, now)
		}
	}
	l.pods.dropIdle(func(e *prefillPod) bool {
		return e.nActive == 0 && e.nKV == 0 && now.Sub(e.touched) >= IdleAfter
	}, l.o.Gauges)
	l.mu.Unlock()
	logExpired(l.o.Logger, "prefill", exp)
}

// releasePart takes one charge of tokens off a counter held by n charges; the last one
// leaves exactly zero, whatever float rounding of fractional charges left behind.
func releasePart(v *atomicFloat, n *int, tokens float64) {
	if *n--; *n <= 0 {
		*n = 0
		v.Store(0)
		return
	}
	v.add(-tokens)
}
