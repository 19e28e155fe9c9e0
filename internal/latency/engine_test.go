package latency

import (
	"testing"

	"github.com/tandem-epp/tandem/internal/metrics"
)

// Slots are learned from three samples in a row with requests waiting while the same number
// run, and forgotten when more than that run.
func TestEngineSlots(t *testing.T) {
	type rw struct{ running, waiting float64 }
	for _, c := range []struct {
		name    string
		samples []rw
		want    float64
	}{
		{"4 running, some waiting, three times: 4 slots", []rw{{4, 2}, {4, 1}, {4, 3}}, 4},
		{"twice is not enough", []rw{{4, 2}, {4, 1}}, 0},
		{"the run restarts when the count changes", []rw{{4, 2}, {5, 1}, {5, 1}, {5, 2}}, 5},
		{"a sample with none waiting does not break the run", []rw{{4, 2}, {4, 0}, {4, 1}, {4, 1}}, 4},
		{"more running than the slots learned: forgotten", []rw{{4, 2}, {4, 1}, {4, 3}, {6, 0}}, 0},
		{"none waiting: nothing learned", []rw{{4, 0}, {4, 0}, {4, 0}}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s engineSlots
			for _, x := range c.samples {
				s.learn(x.running, x.waiting)
			}
			if s.n != c.want {
				t.Errorf("slots %v, want %v", s.n, c.want)
			}
		})
	}
}

// The prompt tokens an interval took are the counter's increase (unknown on the first read
// and after a reset); the mean prompt is the decayed sums' ratio.
func TestEnginePrompts(t *testing.T) {
	var e enginePrompts
	for _, c := range []struct {
		counter float64
		want    float64
		ok      bool
	}{{1000, 0, false}, {1500, 500, true}, {200, 0, false}, {300, 100, true}} {
		got, ok := e.took(&metrics.Sample{HasPromptTokens: true, PromptTokens: c.counter})
		if got != c.want || ok != c.ok {
			t.Errorf("counter %v: took %v (%v), want %v (%v)", c.counter, got, ok, c.want, c.ok)
		}
	}
	if got, ok := e.took(&metrics.Sample{}); got != 0 || ok {
		t.Errorf("no counter: took %v (%v), want nothing", got, ok)
	}
	if m := e.mean(500, 2); !near(m, 250, 1e-12) {
		t.Errorf("mean %v, want 500/2", m)
	}
	if m := e.mean(300, 1); !near(m, 750/2.8, 1e-12) { // (0.9·500 + 300) / (0.9·2 + 1)
		t.Errorf("mean %v, want 750/2.8", m)
	}
}

// The ends of an interval are fitted at their mean features: a 10k-token prompt (1, 1, 1) and
// a 20k one with 10k cached (1, 1, (4e8 − 1e8)/1e8 = 3) average (1, 1, 2).
func TestIntervalEnds(t *testing.T) {
	var e intervalEnds
	e.add(Prompt{Tokens: 10000})
	e.add(Prompt{Tokens: 20000, Cached: 10000})
	if got, want := e.mean(), [3]float64{1, 1, 2}; got != want || e.n != 2 {
		t.Errorf("mean %v over %v ends, want %v over 2", got, e.n, want)
	}
}

// The engine's queue time less the ledger's mean wait (bookings at 0.2 s and 0.4 s, 0.3 s at
// the sample: 0.3 s) is the wait for work others routed, unless the interval's requests were
// Tandem's alone.
func TestUnseenQueue(t *testing.T) {
	for _, c := range []struct {
		name             string
		s                metrics.Sample
		unknown, running float64
		want             float64
	}{
		{"others' requests waited 0.5 s: 0.2 s beyond the ledger's 0.3",
			metrics.Sample{HasQueueTimeMean: true, QueueTimeMean: 0.5, QueueCount: 10}, 0, 0, 0.2},
		{"waits shorter than the ledger's: nothing unseen",
			metrics.Sample{HasQueueTimeMean: true, QueueTimeMean: 0.1, QueueCount: 10}, 0, 0, 0},
		{"10 scheduled, 1 of Tandem's ended and 9 running: Tandem's alone",
			metrics.Sample{HasQueueTimeMean: true, QueueTimeMean: 0.5, QueueCount: 10}, 0, 9, 0},
		{"nothing left the queue of an idle engine",
			metrics.Sample{HasQueueTimeMean: true, QueueCount: 0}, 0, 0, 0},
		{"nothing left the queue of a stuck one: the last measure stands",
			metrics.Sample{HasQueueTimeMean: true, QueueCount: 0}, 3, 0, 0.7},
		{"no queue histogram", metrics.Sample{}, 3, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := unseenQueue{unseenWait: 0.7}
			u.booked(0.2)
			u.booked(0.4)
			u.ownQueued = 1
			u.seen(&c.s, 0.3, c.unknown, c.running)
			if !near(u.unseenWait, c.want, 1e-9) {
				t.Errorf("unseen wait %.4f, want %.4f", u.unseenWait, c.want)
			}
			if u.ownQueued != 0 || u.knownSum != 0 || u.knownN != 0 {
				t.Errorf("the interval's sums were not reset: %+v", u)
			}
		})
	}
}
