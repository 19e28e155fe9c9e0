package latency

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/outcome"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// rig is a recorder feeding models on a manual clock: the test plays the gateway.
type rig struct {
	clock *load.ManualClock
	rec   *outcome.Recorder
	m     *Models
}

func newRig(o Options) *rig {
	clock := load.NewManualClock(t0)
	o.Clock = clock
	r := &rig{clock: clock, rec: outcome.NewRecorder(clock), m: New(o)}
	r.rec.Subscribe(r.m)
	return r
}

// chargePD starts a PD route of a 1,000-token prompt to ns/d:1 and books its prefill of s
// seconds on the prefill pod key's ledger.
func (r *rig) chargePD(key string, s float64) *outcome.Tracker {
	tr := r.rec.Start(outcome.KindPD, key, "ns/d:1", 1000)
	r.m.Charge(tr.ID(), Charge{Kind: outcome.KindPD, Prefill: key, Destination: "ns/d:1", Prompt: Prompt{Tokens: 1000}, Service: s})
	return tr
}

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Abs(want) }

// trueService is a pod's real prefill time: 2 ms + 30 µs per uncached token + attention.
func trueService(p Prompt, speed float64) float64 {
	P, C := float64(p.Tokens), float64(p.Cached)
	return (0.002 + 3e-5*(P-C) + 7.5e-10*(P*P-C*C)) / speed
}

// One idle pod serving whole requests one at a time: from the defaults (20k tokens/s), the
// model learns the pod's true prefill time within a few percent, and then predicts it.
func TestPrefillModelLearnsAPod(t *testing.T) {
	for _, speed := range []float64{1, 0.5, 2} {
		r := newRig(Options{})
		rng := rand.New(rand.NewPCG(1, uint64(speed*10)))
		for range 300 {
			p := Prompt{Tokens: 100 + rng.IntN(30000)}
			p.Cached = rng.IntN(p.Tokens / 2)
			tr := r.rec.Start(outcome.KindWhole, "", "ns/a:1", p.Tokens)
			_, svc := r.m.Prefill("ns/a:1", p)
			r.m.Charge(tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: "ns/a:1", Destination: "ns/a:1", Prompt: p, Service: svc})
			r.clock.Advance(secs(trueService(p, speed)))
			tr.Chunk(10)
			tr.End(nil)
			r.clock.Advance(time.Second) // idle between requests
		}
		for _, p := range []Prompt{{Tokens: 1000}, {Tokens: 8192}, {Tokens: 32000, Cached: 16000}, {Tokens: 60000}} {
			_, got := r.m.Prefill("ns/a:1", p)
			if want := trueService(p, speed); !near(got, want, 0.05) {
				t.Errorf("speed %v, %+v: predicted %.4f s, true %.4f s", speed, p, got, want)
			}
		}
		if e := r.m.Errors(); e.N != 0 {
			t.Errorf("no TTFT was predicted, yet %d errors", e.N)
		}
	}
}

// The busy-until ledger: charges queue behind each other; an end earlier or later than
// predicted moves the work behind it by the same amount; an idle pod is free at once; a
// failed prefill gives back what was left of it.
func TestBusyUntilLedger(t *testing.T) {
	r := newRig(Options{})
	key := "ns/p:1"
	charge := func(s float64) *outcome.Tracker { return r.chargePD(key, s) }
	wait := func() float64 { w, _ := r.m.Prefill(key, Prompt{Tokens: 1}); return w }
	a, b, c := charge(0.2), charge(0.3), charge(0.5)
	if w := wait(); !near(w, 1.0, 1e-9) {
		t.Fatalf("three charges: wait %.3f, want 1.0", w)
	}
	r.clock.Advance(secs(0.1))
	if w := wait(); !near(w, 0.9, 1e-9) {
		t.Fatalf("0.1 s later: wait %.3f, want 0.9", w)
	}
	r.clock.Advance(secs(0.15))
	a.PrefillEnd(nil, true) // due at 0.2, ended at 0.25: the rest moves 0.05 s later
	if w := wait(); !near(w, 0.8, 1e-9) {
		t.Fatalf("first ended 50 ms late: wait %.3f, want 0.8", w)
	}
	r.clock.Advance(secs(0.1))
	b.PrefillEnd(nil, true) // due at 0.55, ended at 0.35: 0.2 s early
	if w := wait(); !near(w, 0.5, 1e-9) {
		t.Fatalf("second ended 200 ms early: wait %.3f, want 0.5 (the third alone)", w)
	}
	r.clock.Advance(secs(0.2))
	c.PrefillEnd(errBoom{}, true) // failed after 0.2 of its 0.5 s: nothing left
	if w := wait(); w != 0 {
		t.Fatalf("all ended: wait %.3f, want 0", w)
	}
	if bl, n := r.m.Local(key, r.clock.Now()); bl != 0 || n != 0 {
		t.Errorf("local %.3f / %d, want 0 / 0", bl, n)
	}
	d := charge(1.0)
	r.clock.Advance(secs(0.25))
	d.End(errBoom{}) // the request failed before its prefill ended
	if w := wait(); w != 0 {
		t.Errorf("dropped charge: wait %.3f, want 0", w)
	}
}

type errBoom struct{}

func (errBoom) Error() string { return "boom" }

// Short prompts that end in one iteration share its time in proportion to their predicted
// service (a FIFO estimate would give the first everything and the others nothing).
func TestBatchedEndsShareTheIteration(t *testing.T) {
	r := newRig(Options{})
	key := "ns/p:1"
	p := Prompt{Tokens: 1000} // default model: 0.01 + 0.05 + 0.001 = 0.061 s
	var trs []*outcome.Tracker
	for range 4 {
		tr := r.rec.Start(outcome.KindPD, key, "ns/d:1", p.Tokens)
		_, svc := r.m.Prefill(key, p)
		r.m.Charge(tr.ID(), Charge{Kind: outcome.KindPD, Prefill: key, Destination: "ns/d:1", Prompt: p, Service: svc})
		trs = append(trs, tr)
	}
	r.clock.Advance(secs(0.1)) // the four took 0.1 s together: 25 ms each
	for _, tr := range trs {
		tr.PrefillEnd(nil, true)
	}
	r.clock.Advance(time.Second)
	// The next end closes the group and fits it.
	tr := r.rec.Start(outcome.KindPD, key, "ns/d:1", p.Tokens)
	r.m.Charge(tr.ID(), Charge{Kind: outcome.KindPD, Prefill: key, Destination: "ns/d:1", Prompt: p, Service: 0.025})
	r.clock.Advance(secs(0.025))
	tr.PrefillEnd(nil, true)
	if c := r.m.Coefficients(key); c.PrefillObservations != 4 {
		t.Fatalf("%d observations fitted, want the group's 4", c.PrefillObservations)
	}
	if _, svc := r.m.Prefill(key, p); !near(svc, 0.025, 0.15) {
		t.Errorf("after four batched 25 ms prefills the model predicts %.4f s, want ≈ 0.025", svc)
	}
}

// The hand-over to a decode pod: the prefill work booked on it ahead of the decode leg,
// the KV transfer and one decode iteration; the transfer is fitted with the rest taken out.
func TestHandover(t *testing.T) {
	r := newRig(Options{})
	p, d := "ns/p:1", "ns/d:1"
	// Book 0.3 s of whole-request prefill on the decode pod.
	w := r.rec.Start(outcome.KindWhole, "", d, 5000)
	r.m.Charge(w.ID(), Charge{Kind: outcome.KindWhole, Prefill: d, Destination: d, Prompt: Prompt{Tokens: 5000}, Service: 0.3})
	transfer := r.m.Handover(d, 10000, 10) - r.m.TPOT(d, 10000, 0) // ten seconds on: nothing booked ahead
	if got := r.m.Handover(d, 10000, 0.1); !near(got, 0.2+transfer+r.m.TPOT(d, 10000, 0), 1e-9) {
		t.Errorf("handover after 0.1 s = %.4f, want the 0.2 s still booked + transfer %.4f + a step", got, transfer)
	}
	// Teach it: prefills of 10k tokens end on p; the decode pod answers 40 ms + the booked
	// work and an iteration later.
	for i := range 50 {
		tr := r.rec.Start(outcome.KindPD, p, d, 10000)
		r.m.Charge(tr.ID(), Charge{Kind: outcome.KindPD, Prefill: p, Destination: d, Prompt: Prompt{Tokens: 10000}, Service: 0.3})
		r.clock.Advance(secs(0.3))
		ahead, _ := r.m.Local(d, r.clock.Now())
		it := r.m.TPOT(d, 10000, 0)
		tr.PrefillEnd(nil, true)
		r.clock.Advance(secs(0.04 + ahead + it))
		tr.Chunk(5)
		r.clock.Advance(secs(0.05))
		tr.End(nil)
		if i == 0 {
			w.Chunk(3) // the whole request answers: the decode pod's booked work is done
		}
	}
	if got := r.m.Coefficients(d); !near(got.HandoverBase+got.HandoverPerToken*10000, 0.04, 0.1) {
		t.Errorf("fitted transfer of 10k tokens %.4f s, want ≈ 0.04", got.HandoverBase+got.HandoverPerToken*10000)
	}
}

// The decode step is fitted on inter-chunk gaps, and TPOT predictions stretch it by the
// pod's prefill load.
func TestStepAndTPOT(t *testing.T) {
	r := newRig(Options{})
	d := "ns/d:1"
	trueStep := func(kv float64) float64 { return 0.006 + 5e-8*kv }
	// A decode pod keeping 20 requests of 2000 prompt tokens: every iteration each live
	// request gets a token; every 10 iterations the oldest ends and a new one starts.
	type live struct {
		tr  *outcome.Tracker
		out int
	}
	var reqs []live
	start := func() {
		tr := r.rec.Start(outcome.KindPD, "ns/p:1", d, 2000)
		tr.PrefillEnd(nil, true)
		reqs = append(reqs, live{tr: tr})
	}
	for range 20 {
		start()
	}
	for it := range 3000 {
		kv := 0.0
		for _, q := range reqs {
			kv += 2000 + float64(q.out)
		}
		r.clock.Advance(secs(trueStep(kv)))
		for i := range reqs {
			reqs[i].tr.Chunk(1)
			reqs[i].out++
		}
		if it%10 == 9 {
			reqs[0].tr.End(nil)
			reqs = reqs[1:]
			start()
		}
	}
	kv := 0.0
	for _, q := range reqs {
		kv += 2000 + float64(q.out)
	}
	got, want := r.m.TPOT(d, 2000, 0), trueStep(kv+2000)
	if !near(got, want, 0.1) {
		t.Errorf("TPOT %.5f, want ≈ %.5f", got, want)
	}
	// Prefill work booked now worth half the pod's time while a request decodes: TPOT doubles.
	h := r.m.pods[d].decodeSecs
	if loaded := r.m.TPOT(d, 2000, 0.5*h); !near(loaded, 2*got, 0.01) {
		t.Errorf("with 50 %% prefill load TPOT %.5f, want 2 × %.5f", loaded, got)
	}
}

// The stall budget: a request of 6 tokens with a 50 ms TPOT objective at a 10 ms step can
// absorb (50 − 10) × 5 = 200 ms of stall; prompts booked after it spend it; its end frees it.
func TestStallRoom(t *testing.T) {
	r := newRig(Options{})
	d := "ns/d:1"
	if room := r.m.StallRoom(d); !math.IsInf(room, 1) {
		t.Fatalf("no decode: room %v, want +Inf", room)
	}
	short := r.rec.Start(outcome.KindPD, "ns/p:1", d, 100)
	r.m.Charge(short.ID(), Charge{Kind: outcome.KindPD, Prefill: "ns/p:1", Destination: d, Prompt: Prompt{Tokens: 100},
		Service: 0.01, TPOT: 0.010, TPOTObjective: 0.050, MaxTokens: 6})
	long := r.rec.Start(outcome.KindPD, "ns/p:1", d, 100)
	r.m.Charge(long.ID(), Charge{Kind: outcome.KindPD, Prefill: "ns/p:1", Destination: d, Prompt: Prompt{Tokens: 100},
		Service: 0.01, TPOT: 0.010, TPOTObjective: 0.050, MaxTokens: 500})
	if room := r.m.StallRoom(d); !near(room, 0.2, 1e-9) {
		t.Fatalf("room %.4f, want 0.2 (the short request's)", room)
	}
	w := r.rec.Start(outcome.KindWhole, "", d, 3000)
	step := r.m.StepSeconds(d)
	r.m.Charge(w.ID(), Charge{Kind: outcome.KindWhole, Prefill: d, Destination: d, Prompt: Prompt{Tokens: 3000}, Service: 0.15})
	if room := r.m.StallRoom(d); !near(room, 0.05+step, 1e-6) {
		t.Errorf("after a 150 ms prompt: room %.4f, want 0.05 + one step %.4f", room, step)
	}
	short.End(nil)
	if room := r.m.StallRoom(d); !near(room, 0.04*499-0.15+step, 1e-6) {
		t.Errorf("short one ended: room %.4f, want the long one's %.4f", room, 0.04*499-0.15+step)
	}
}

// Without a shared store, prompts the engine reports waiting beyond those this replica
// routed there (another replica's) lengthen the predicted wait; IgnoreEngineQueue turns it off.
func TestEngineQueueLengthensTheWait(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		var smp *metrics.Sample
		r := newRig(Options{IgnoreEngineQueue: ignore, Samples: func(string) *metrics.Sample { return smp }})
		smp = &metrics.Sample{Waiting: 4, HasWaiting: true, UpdatedAt: r.clock.Now()}
		wait, _ := r.m.Prefill("ns/p:1", Prompt{Tokens: 1000})
		_, mean := r.m.Prefill("ns/p:1", Prompt{Tokens: 1000}) // the pod's mean uncached prompt starts at 1000
		want := 4 * mean
		if ignore {
			want = 0
		}
		if !near(wait, want, 1e-9) && !(want == 0 && wait == 0) {
			t.Errorf("ignore=%v: wait %.4f, want %.4f", ignore, wait, want)
		}
	}
}

// With a decode-side sidecar running the prefill legs Tandem only infers their ends; the
// engine's prefill-time histogram (its mean over each scrape interval) is fitted instead,
// at the mean of the prompts that ended in the interval.
func TestHistogramFitsASidecarPrefillPod(t *testing.T) {
	var smp *metrics.Sample
	r := newRig(Options{Samples: func(string) *metrics.Sample { return smp }})
	p, d := "ns/p:1", "ns/d:1"
	rng := rand.New(rand.NewPCG(3, 3))
	for i := range 200 {
		var sum float64
		var n int
		for range 3 {
			pr := Prompt{Tokens: 500 + rng.IntN(12000)}
			tr := r.rec.Start(outcome.KindPD, p, d, pr.Tokens)
			r.m.Charge(tr.ID(), Charge{Kind: outcome.KindPD, Prefill: p, Destination: d, Prompt: pr, Service: 0.1})
			s := trueService(pr, 1)
			sum += s
			n++
			r.clock.Advance(secs(s + 0.05))
			tr.Response(200, d) // sidecar: the decode pod answers once the leg is done
			tr.PrefillEnd(nil, false)
			tr.Chunk(4)
			tr.End(nil)
		}
		smp = &metrics.Sample{PrefillTimeMean: sum / float64(n), PrefillCount: float64(n), HasPrefillTimeMean: true,
			UpdatedAt: t0.Add(time.Duration(i+1) * time.Hour)}
		r.m.Prefill(p, Prompt{Tokens: 1}) // a pick reads the sample
	}
	for _, pr := range []Prompt{{Tokens: 2000}, {Tokens: 8000}} {
		if _, got := r.m.Prefill(p, pr); !near(got, trueService(pr, 1), 0.15) {
			t.Errorf("%d tokens: predicted %.4f, true %.4f", pr.Tokens, got, trueService(pr, 1))
		}
	}
}

// A prefill pod no strategy books (the PD policies other than pd-predictive), its legs run by a
// decode-side sidecar: for the transfer proof, the engine's prefill-time histogram is fitted at
// the mean prompt its prompt-token counter reports, over intervals (a prompt counted in one
// interval may finish its prefill in the next). The picks' own model is left as it was: on a
// decode pod that histogram is its KV loads.
func TestHistogramFitsAnUnbookedPod(t *testing.T) {
	var smp *metrics.Sample
	r := newRig(Options{Samples: func(string) *metrics.Sample { return smp }})
	p := "ns/p:1"
	if _, ok := r.m.ProofPrefill(p, Prompt{Tokens: 4000}); ok {
		t.Fatal("a pod nothing was learned about has a proof prefill")
	}
	rng := rand.New(rand.NewPCG(4, 4))
	// Each prompt is counted when it arrives; a third of them finish their prefill in the
	// next interval.
	counter, next := 0.0, []Prompt(nil)
	for i := range 300 {
		done := next
		next = nil
		for range 1 + rng.IntN(3) {
			pr := Prompt{Tokens: 3000 + rng.IntN(2000)}
			counter += float64(pr.Tokens)
			if rng.IntN(3) == 0 {
				next = append(next, pr)
			} else {
				done = append(done, pr)
			}
		}
		var sum, n float64
		for _, pr := range done {
			sum += trueService(pr, 1)
			n++
		}
		if n == 0 {
			continue
		}
		smp = &metrics.Sample{PrefillTimeMean: sum / n, PrefillCount: n, HasPrefillTimeMean: true,
			PromptTokens: counter, HasPromptTokens: true, UpdatedAt: t0.Add(time.Duration(i+1) * time.Second)}
		r.clock.Advance(time.Second)
		r.m.Prefill(p, Prompt{Tokens: 1}) // a pick reads the sample
	}
	_, cold := r.m.Prefill("ns/other:1", Prompt{Tokens: 4000})
	for _, pr := range []Prompt{{Tokens: 3500}, {Tokens: 4500}} {
		got, ok := r.m.ProofPrefill(p, pr)
		if !ok || !near(got, trueService(pr, 1), 0.1) || near(cold, trueService(pr, 1), 0.2) {
			t.Errorf("%d tokens: proof prefill %.4f (%v), true %.4f (a pod learned nothing of: %.4f)", pr.Tokens, got, ok, trueService(pr, 1), cold)
		}
	}
	if _, picks := r.m.Prefill(p, Prompt{Tokens: 4000}); picks != cold {
		t.Errorf("the picks' prefill model moved (%.4f, was %.4f): only the proof's may", picks, cold)
	}
}

// Every prediction that met its first byte is in the error summary and goes to the observer.
func TestPredictionErrors(t *testing.T) {
	var seen []float64
	r := newRig(Options{Observer: observerFunc(func(kind, ep string, pred, obs time.Duration) {
		seen = append(seen, obs.Seconds()/pred.Seconds())
	})})
	for _, c := range []struct{ pred, obs float64 }{{0.1, 0.1}, {0.1, 0.2}, {0.2, 0.1}, {0.1, 0.125}} {
		tr := r.rec.Start(outcome.KindWhole, "", "ns/a:1", 10)
		r.m.Charge(tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: "ns/a:1", Destination: "ns/a:1", Prompt: Prompt{Tokens: 10}, Service: c.pred, TTFT: c.pred})
		r.clock.Advance(secs(c.obs))
		tr.Chunk(1)
		tr.End(nil)
	}
	e := r.m.Errors()
	// |obs − pred| / obs: 0, 0.5, 1, 0.2 → mean 0.425; ratios 1, 2, 0.5, 1.25 → geometric mean 1.118.
	if e.N != 4 || !near(e.MeanAbsRel, 0.425, 1e-9) || !near(e.Bias, math.Pow(1.25, 0.25), 1e-9) {
		t.Errorf("summary %+v", e)
	}
	if e.RatioP10 != 0.5 || e.RatioP90 != 2 || len(seen) != 4 {
		t.Errorf("p10 %v p90 %v, observer saw %d", e.RatioP10, e.RatioP90, len(seen))
	}
	if f, _, ok := r.m.PodError("ns/a:1"); !ok || f <= 1 {
		t.Errorf("pod error factor %v ok %v", f, ok)
	}
}

type observerFunc func(kind, ep string, pred, obs time.Duration)

func (f observerFunc) TTFTPrediction(kind, ep string, pred, obs time.Duration) {
	f(kind, ep, pred, obs)
}

// Endpoints that left the pool are forgotten; the models of the others stay.
func TestForget(t *testing.T) {
	r := newRig(Options{})
	r.m.Prefill("ns/a:1", Prompt{Tokens: 1})
	r.m.Prefill("ns/b:1", Prompt{Tokens: 1})
	r.m.Forget(func(k string) bool { return k == "ns/a:1" })
	if keys := r.m.Keys(); len(keys) != 1 || keys[0] != "ns/a:1" {
		t.Errorf("keys %v", keys)
	}
}

// A pod restarted under the same key starts afresh: the old pod's requests, ending after the
// restart, neither give back the new pod's bookings nor count down its requests.
func TestForgottenPodsRoutesChangeNothingAfterARestart(t *testing.T) {
	r := newRig(Options{})
	const prefill = "ns/p:1"
	old := r.chargePD(prefill, 0.5)                             // booked on the old prefill pod, decoding on ns/d:1
	oldWhole := r.rec.Start(outcome.KindWhole, "", prefill, 10) // running whole on the old pod
	r.m.Charge(oldWhole.ID(), Charge{Kind: outcome.KindWhole, Prefill: prefill, Destination: prefill, Prompt: Prompt{Tokens: 10}, Service: 0.1})
	r.m.Forget(func(k string) bool { return k != prefill }) // restarted at another address
	_ = r.chargePD(prefill, 0.5)                            // the new pod's first request
	w0, _ := r.m.Prefill(prefill, Prompt{Tokens: 1})
	_, n0 := r.m.Local(prefill, r.clock.Now())
	old.PrefillEnd(errors.New("the old pod is gone"), true)
	old.End(errors.New("the old pod is gone"))
	oldWhole.End(errors.New("the old pod is gone"))
	w1, _ := r.m.Prefill(prefill, Prompt{Tokens: 1})
	_, n1 := r.m.Local(prefill, r.clock.Now())
	if n0 != 1 || n1 != n0 || math.Abs(w1-w0) > 1e-9 {
		t.Errorf("the new pod: wait %.3f s, %d charges before the old routes ended; %.3f s, %d after (want 1 charge, unchanged)", w0, n0, w1, n1)
	}
}

// A pod Tandem has seen no stream on (another replica routes its traffic, or answers are not
// streamed) learns its decode step from the engine's inter-token histogram; once Tandem has
// fitted a stream of its own there, the histogram is no longer used.
func TestInterTokenHistogramFitsTheStep(t *testing.T) {
	var smp *metrics.Sample
	r := newRig(Options{Samples: func(string) *metrics.Sample { return smp }})
	d := "ns/d:1"
	// The engine decodes 40 requests over 2M KV tokens at 30 ms a token. Without the
	// histogram the cold-start model predicts its step at that load far off.
	smp = &metrics.Sample{Running: 40, HasRunning: true, KVUsage: 0.5, HasKVUsage: true, BlockSize: 16, NumGPUBlocks: 250000, UpdatedAt: t0}
	f0 := r.m.Forecast(d)
	cold := f0.Step(0)
	for i := range 50 {
		smp = &metrics.Sample{Running: 40, HasRunning: true, KVUsage: 0.5, HasKVUsage: true, BlockSize: 16, NumGPUBlocks: 250000,
			InterTokenMean: 0.030, InterTokenCount: 400, HasInterTokenMean: true, UpdatedAt: t0.Add(time.Duration(i+1) * time.Second)}
		r.clock.Advance(time.Second)
		r.m.StepSeconds(d) // a pick reads the sample
	}
	f := r.m.Forecast(d)
	if got := f.Step(0); !near(got, 0.030, 0.1) || math.Abs(cold-0.030) < 0.02 {
		t.Fatalf("step at the engine's load: %.4f s (cold %.4f), want the histogram's 0.030", got, cold)
	}
	// Tandem's own stream: 10 ms between chunks with nothing else on the pod. Afterwards the
	// histogram (still 30 ms) moves the step no more.
	tr := r.rec.Start(outcome.KindWhole, "", d, 10)
	r.m.Charge(tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: d, Destination: d, Prompt: Prompt{Tokens: 10}, Service: 0.001})
	r.clock.Advance(10 * time.Millisecond)
	for range 20 {
		tr.Chunk(4)
		r.clock.Advance(10 * time.Millisecond)
	}
	tr.End(nil)
	before := r.m.Coefficients(d)
	for i := range 20 {
		smp = &metrics.Sample{Running: 40, HasRunning: true, InterTokenMean: 0.030, InterTokenCount: 400, HasInterTokenMean: true,
			UpdatedAt: t0.Add(time.Duration(100+i) * time.Second)}
		r.clock.Advance(time.Second)
		r.m.StepSeconds(d)
	}
	if after := r.m.Coefficients(d); after.StepObservations != before.StepObservations {
		t.Fatalf("the histogram was fitted after Tandem's own stream: %d → %d step observations", before.StepObservations, after.StepObservations)
	}
}

// A whole route booked on A but served by its fallback B (A refused the connection): A's
// booking is given back without counting as prefill work done there, the prediction made
// for A meets no outcome (B's time says nothing of A), and the request decodes on B — its
// requests and KV count there, not on A.
func TestFallbackServedRoute(t *testing.T) {
	var observed int
	r := newRig(Options{Observer: observerFunc(func(string, string, time.Duration, time.Duration) { observed++ })})
	a, b, idle := "ns/a:1", "ns/b:1", "ns/c:1"
	p := Prompt{Tokens: 100000}
	tr := r.rec.Start(outcome.KindWhole, "", a, p.Tokens)
	r.m.Charge(tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: a, Destination: a, Prompt: p, Service: 1, TTFT: 1})
	step := func(k string) float64 { f := r.m.Forecast(k); return f.Step(0) }
	if step(a) <= step(idle) {
		t.Fatalf("the pick did not count the request on A: step %v, idle %v", step(a), step(idle))
	}
	r.clock.Advance(secs(0.1))
	tr.Response(200, b)
	tr.Chunk(10)
	if got, want := step(a), step(idle); got != want {
		t.Errorf("A's step %v once B serves, want an idle pod's %v", got, want)
	}
	if step(b) <= step(idle) {
		t.Errorf("B's step %v does not count the request it decodes (idle %v)", step(b), step(idle))
	}
	if backlog, charges := r.m.Local(a, r.m.Now()); backlog != 0 || charges != 0 {
		t.Errorf("A still booked: backlog %v, charges %d", backlog, charges)
	}
	if _, _, ok := r.m.PodError(a); ok {
		t.Errorf("A has a prediction error from B's answer")
	}
	if e := r.m.Errors(); e.N != 0 || observed != 0 {
		t.Errorf("a prediction for A met B's outcome: %d errors, %d observed", e.N, observed)
	}
	f := r.m.Forecast(a)
	if f.TPOT(0, 0) != r.m.TPOT(idle, 0, 0) {
		t.Errorf("A's TPOT %v counts prefill load it never ran (idle %v)", f.TPOT(0, 0), r.m.TPOT(idle, 0, 0))
	}
	r.clock.Advance(secs(0.5))
	tr.End(nil)
	if step(b) != step(idle) || step(a) != step(idle) {
		t.Errorf("after the end: A %v, B %v, idle %v", step(a), step(b), step(idle))
	}
}

// PrefillWait: a booked route's prefill starts once the work booked ahead of it on the ledger
// ends (moved as that work ends late); an unbooked one's after the pod's predicted wait.
func TestPrefillWait(t *testing.T) {
	r := newRig(Options{})
	key := "ns/p:1"
	a, b := r.chargePD(key, 0.2), r.chargePD(key, 0.3)
	if got := r.m.PrefillWait(b.ID(), key, Prompt{Tokens: 1000}); !near(got, 0.2, 1e-9) {
		t.Errorf("second booked: wait %.3f s, want 0.2 (the first ahead of it)", got)
	}
	r.clock.Advance(secs(0.3))
	a.PrefillEnd(nil, true) // 0.1 s late: the second starts now
	if got := r.m.PrefillWait(b.ID(), key, Prompt{Tokens: 1000}); got > 1e-9 {
		t.Errorf("after the first ended: wait %.3f s, want 0", got)
	}
	c := r.chargePD(key, 0.1)
	if got := r.m.PrefillWait(c.ID(), key, Prompt{Tokens: 1000}); !near(got, 0.3, 1e-9) {
		t.Errorf("third booked behind the second: wait %.3f s, want 0.3", got)
	}
	u := r.rec.Start(outcome.KindPD, key, "ns/d:1", 1000) // routed by a strategy that books nothing
	wait, _ := r.m.Prefill(key, Prompt{Tokens: 1000})
	if got := r.m.PrefillWait(u.ID(), key, Prompt{Tokens: 1000}); !near(got, wait, 1e-9) || wait <= 0 {
		t.Errorf("unbooked: wait %.3f s, want the pod's %.3f", got, wait)
	}
}
