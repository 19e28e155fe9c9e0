package latency

import (
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/tandem-epp/tandem/internal/outcome"
)

// engineKind is how a simulated pod schedules the prompts routed to it.
type engineKind int

const (
	serialEngine     engineKind = iota // one prompt at a time, in arrival order
	concurrentEngine                   // every prompt from its arrival, slowed 10 % per other prompt running (llm-d's simulator)
	batchedEngine                      // one batch at a time: the prompts waiting when it frees run together and end together (one iteration)
)

// overlapRun plays Poisson arrivals of prompts of 500–8,000 tokens, routed whole, on one pod of
// the given kind, and returns the median and the 10th/90th percentiles of observed ÷
// predicted TTFT after the warm-up, with the pod's learned overlap.
func overlapRun(t *testing.T, kind engineKind, rate float64, seed uint64) (p10, p50, p90, overlap float64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 11))
	type job struct {
		arrive, end float64
		p           Prompt
		tr          *outcome.Tracker
		predicted   float64
	}
	var jobs []*job
	for at := rng.ExpFloat64() / rate; at < 600; at += rng.ExpFloat64() / rate {
		jobs = append(jobs, &job{arrive: at, p: Prompt{Tokens: 500 + rng.IntN(7500)}})
	}
	switch kind {
	case serialEngine:
		free := 0.0
		for _, j := range jobs {
			j.end = math.Max(j.arrive, free) + trueService(j.p, 1)
			free = j.end
		}
	case batchedEngine:
		free := 0.0
		for i := 0; i < len(jobs); {
			start := math.Max(jobs[i].arrive, free)
			batch := 0.0
			k := i
			for ; k < len(jobs) && jobs[k].arrive <= start; k++ {
				batch += trueService(jobs[k].p, 1)
			}
			for ; i < k; i++ {
				jobs[i].end = start + batch
			}
			free = start + batch
		}
	case concurrentEngine:
		// Each prompt runs from its arrival at a pace of 1/(1 + 0.1·others running); stepped
		// in 1 ms slices.
		left := map[*job]float64{}
		next := 0
		for now := 0.0; next < len(jobs) || len(left) > 0; now += 0.001 {
			for next < len(jobs) && jobs[next].arrive <= now {
				left[jobs[next]] = trueService(jobs[next].p, 1)
				next++
			}
			pace := 0.001 / (1 + 0.1*float64(max(len(left)-1, 0)))
			for j, l := range left {
				if l -= pace; l <= 0 {
					j.end = now + 0.001
					delete(left, j)
				} else {
					left[j] = l
				}
			}
		}
	}
	type event struct {
		at  float64
		end bool
		j   *job
	}
	var evs []event
	for _, j := range jobs {
		evs = append(evs, event{j.arrive, false, j}, event{j.end, true, j})
	}
	sort.SliceStable(evs, func(a, b int) bool { return evs[a].at < evs[b].at })
	r := newRig(Options{})
	key := "ns/p:1"
	var ratios []float64
	for _, e := range evs {
		r.clock.Set(t0.Add(secs(e.at)))
		if !e.end {
			e.j.tr = r.rec.Start(outcome.KindWhole, "", key, e.j.p.Tokens)
			f := r.m.Forecast(key)
			e.j.predicted = f.Wait() + f.Service(e.j.p)
			r.m.Charge(e.j.tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: key, Destination: key, Prompt: e.j.p, Service: f.Service(e.j.p)})
			continue
		}
		e.j.tr.Chunk(1)
		e.j.tr.End(nil)
		if e.j.arrive >= 60 {
			ratios = append(ratios, (e.j.end-e.j.arrive)/e.j.predicted)
		}
	}
	sort.Float64s(ratios)
	q := func(x float64) float64 { return ratios[int(x*float64(len(ratios)-1))] }
	return q(0.1), q(0.5), q(0.9), r.m.pods[key].overlap()
}

// An engine that prefills every prompt from its arrival, many at once (llm-d's simulator;
// continuous batching without a token budget), is not a queue: a prompt routed behind others
// does not wait for them. The models learn how much of the booked work ahead a new prompt
// actually waits for, from the ends they observe, so its TTFT is predicted within 15 % at the
// median and no more than 1.7× too high at the 10th percentile (on main: 0.41–0.67 at the
// median, 0.12–0.25 at the 10th percentile); a one-at-a-time engine keeps its exact predictions,
// and one that runs the prompts waiting together (one iteration) is not taken for overlapping.
func TestConcurrentPrefillIsLearned(t *testing.T) {
	for _, c := range []struct {
		name string
		kind engineKind
		rate float64
	}{
		{"concurrent", concurrentEngine, 8},
		{"concurrent-busy", concurrentEngine, 16},
		{"serial", serialEngine, 6},
		{"batched", batchedEngine, 8},
	} {
		for seed := uint64(1); seed <= 2; seed++ {
			p10, p50, p90, overlap := overlapRun(t, c.kind, c.rate, seed)
			t.Logf("%-16s seed %d: observed ÷ predicted TTFT p10 %.2f p50 %.2f p90 %.2f; overlap %.2f", c.name, seed, p10, p50, p90, overlap)
			switch c.kind {
			case concurrentEngine:
				if p50 < 0.85 || p50 > 1.15 || p10 < 0.6 {
					t.Errorf("%s seed %d: observed ÷ predicted TTFT p10 %.2f p50 %.2f, want a median within [0.85, 1.15] and p10 ≥ 0.6", c.name, seed, p10, p50)
				}
			case serialEngine:
				if overlap != 1 {
					t.Errorf("%s seed %d: overlap %v, want exactly 1 (its prefills end in booking order)", c.name, seed, overlap)
				}
				if p10 < 0.97 || p90 > 1.03 {
					t.Errorf("%s seed %d: p10 %.2f p90 %.2f, want the queue's exact predictions (within 3 %%)", c.name, seed, p10, p90)
				}
			case batchedEngine:
				// The first prompt of a batch waits for the whole batch: no per-prompt model
				// predicts it well, but the engine is a queue, not one that overlaps prompts.
				if overlap != 1 {
					t.Errorf("%s seed %d: overlap %v, want exactly 1 (a queue that serves a batch at a time)", c.name, seed, overlap)
				}
			}
		}
	}
}

// A prompt that a later one overtook and that then failed before its prefill ended (a cancelled
// request) leaves nothing behind: the next overtake on the pod is judged as the first was.
func TestOvertakeJudgedAfterAFailedHead(t *testing.T) {
	r := newRig(Options{})
	key := "ns/p:1"
	start := func(s float64) *outcome.Tracker {
		p := Prompt{Tokens: 1000}
		tr := r.rec.Start(outcome.KindWhole, "", key, p.Tokens)
		r.m.Charge(tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: key, Destination: key, Prompt: p, Service: s})
		return tr
	}
	long := start(1)
	r.clock.Advance(secs(0.01))
	short := start(0.1)
	r.clock.Advance(secs(0.1))
	short.Chunk(1) // ends before the prompt booked ahead of it
	long.End(errors.New("client cancelled"))
	long2 := start(1)
	r.clock.Advance(secs(0.01))
	short2 := start(0.1)
	r.clock.Advance(secs(0.1))
	short2.Chunk(1)
	r.clock.Advance(secs(0.5))
	long2.Chunk(1)
	if n := r.m.pods[key].overlapEst.overtakes; n != 1 {
		t.Errorf("overtakes %d, want 1 (the second, judged when the prompt it overtook ended)", n)
	}
}
