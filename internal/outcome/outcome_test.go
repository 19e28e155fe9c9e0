package outcome

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/load"
)

// collect is a Reader keeping copies of every event.
type collect struct {
	mu  sync.Mutex
	evs []Event
}

func (c *collect) Observe(e *Event) {
	c.mu.Lock()
	c.evs = append(c.evs, *e)
	c.mu.Unlock()
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// Each case drives one route through its writer calls, the clock advancing between them,
// and lists the phases the reader must see, with what the last event says.
func TestRouteEvents(t *testing.T) {
	type step struct {
		after time.Duration // clock advance before the call
		do    func(*Tracker)
	}
	boom := errors.New("reset")
	cases := []struct {
		name   string
		kind   Kind
		steps  []step
		phases []Phase
		check  func(t *testing.T, r Route)
	}{
		{"pd, epp hand-off", KindPD, []step{
			{ms(120), func(tr *Tracker) { tr.PrefillEnd(nil, true) }},
			{ms(30), func(tr *Tracker) { tr.Response(200, "ns/d:8000") }},
			{ms(5), func(tr *Tracker) { tr.PrefillEnd(nil, false) }}, // inferred later: ignored
			{ms(5), func(tr *Tracker) { tr.Chunk(10) }},
			{ms(10), func(tr *Tracker) { tr.Chunk(0) }}, // no bytes: not a chunk
			{ms(10), func(tr *Tracker) { tr.Chunk(20) }},
			{ms(20), func(tr *Tracker) { tr.Chunk(30) }},
			{ms(1), func(tr *Tracker) { tr.End(nil) }},
		}, []Phase{PhaseStart, PhasePrefillEnd, PhaseFirstByte, PhaseProgress, PhaseProgress, PhaseEnd}, func(t *testing.T, r Route) {
			// prefill 120 ms after the pick, observed; first byte at 160 ms; chunks at 160,
			// 180, 200 ms: two gaps of 20 ms.
			if got := r.PrefillEnd.Sub(r.Picked); got != ms(120) || !r.PrefillObserved {
				t.Errorf("prefill end %v observed %v, want 120ms true", got, r.PrefillObserved)
			}
			if r.TTFT() != ms(160) || r.Chunks != 3 || r.Bytes != 60 || r.ChunkGap() != ms(20) {
				t.Errorf("ttft %v chunks %d bytes %d gap %v, want 160ms 3 60 20ms", r.TTFT(), r.Chunks, r.Bytes, r.ChunkGap())
			}
			if r.Status != 200 || r.ServedBy() != "ns/d:8000" || r.End.Sub(r.Picked) != ms(201) || r.Err != nil {
				t.Errorf("status %d served %q end %v err %v", r.Status, r.ServedBy(), r.End.Sub(r.Picked), r.Err)
			}
		}},
		{"pd, sidecar: the end of the prefill inferred from the decode pod's answer", KindPD, []step{
			{ms(200), func(tr *Tracker) { tr.PrefillEnd(nil, false) }},
			{0, func(tr *Tracker) { tr.Response(200, "") }},
			{ms(15), func(tr *Tracker) { tr.Chunk(1) }},
			{ms(5), func(tr *Tracker) { tr.End(nil) }},
		}, []Phase{PhaseStart, PhasePrefillEnd, PhaseFirstByte, PhaseEnd}, func(t *testing.T, r Route) {
			if r.PrefillObserved || r.PrefillEnd.Sub(r.Picked) != ms(200) || r.ServedBy() != "ns/d:8000" || r.ChunkGap() != 0 {
				t.Errorf("observed %v prefill %v served %q gap %v", r.PrefillObserved, r.PrefillEnd.Sub(r.Picked), r.ServedBy(), r.ChunkGap())
			}
		}},
		{"pd, sidecar: Answered infers the leg's end", KindPD, []step{
			{ms(90), func(tr *Tracker) { tr.Answered(200, "ns/d2:8000", false) }},
			{ms(10), func(tr *Tracker) { tr.End(nil) }},
		}, []Phase{PhaseStart, PhasePrefillEnd, PhaseEnd}, func(t *testing.T, r Route) {
			if r.PrefillObserved || r.PrefillErr != nil || r.PrefillEnd.Sub(r.Picked) != ms(90) || r.Status != 200 || r.ServedBy() != "ns/d2:8000" {
				t.Errorf("observed %v err %v prefill %v status %d served %q, want false nil 90ms 200 ns/d2:8000",
					r.PrefillObserved, r.PrefillErr, r.PrefillEnd.Sub(r.Picked), r.Status, r.ServedBy())
			}
		}},
		{"pd: a combined fallback Answered, so no leg ran", KindPD, []step{
			{ms(40), func(tr *Tracker) { tr.Answered(200, "ns/c:8000", true) }},
			{ms(10), func(tr *Tracker) { tr.End(nil) }},
		}, []Phase{PhaseStart, PhasePrefillEnd, PhaseEnd}, func(t *testing.T, r Route) {
			if !errors.Is(r.PrefillErr, ErrPrefillNotRun) || r.PrefillObserved || r.ServedBy() != "ns/c:8000" {
				t.Errorf("prefill err %v observed %v served %q, want ErrPrefillNotRun false ns/c:8000", r.PrefillErr, r.PrefillObserved, r.ServedBy())
			}
		}},
		{"pd, epp hand-off: the reported leg outranks Answered's inference", KindPD, []step{
			{ms(30), func(tr *Tracker) { tr.PrefillEnd(boom, true) }},
			{ms(20), func(tr *Tracker) { tr.Answered(503, "", true) }},
			{ms(1), func(tr *Tracker) { tr.End(nil) }},
		}, []Phase{PhaseStart, PhasePrefillEnd, PhaseEnd}, func(t *testing.T, r Route) {
			if !errors.Is(r.PrefillErr, boom) || !r.PrefillObserved || r.PrefillEnd.Sub(r.Picked) != ms(30) || r.Status != 503 {
				t.Errorf("prefill err %v observed %v at %v status %d, want reset true 30ms 503", r.PrefillErr, r.PrefillObserved, r.PrefillEnd.Sub(r.Picked), r.Status)
			}
		}},
		{"pd, epp hand-off still running: Answered infers nothing once the leg is reported by what runs it", KindPD, []step{
			{0, func(tr *Tracker) { tr.ReportsLeg() }},
			{ms(20), func(tr *Tracker) { tr.Answered(200, "ns/d:8000", false) }},
			{ms(30), func(tr *Tracker) { tr.PrefillEnd(nil, true) }},
			{ms(1), func(tr *Tracker) { tr.End(nil) }},
		}, []Phase{PhaseStart, PhasePrefillEnd, PhaseEnd}, func(t *testing.T, r Route) {
			if r.PrefillErr != nil || !r.PrefillObserved || r.PrefillEnd.Sub(r.Picked) != ms(50) || r.Status != 200 {
				t.Errorf("prefill err %v observed %v at %v status %d, want nil true 50ms 200", r.PrefillErr, r.PrefillObserved, r.PrefillEnd.Sub(r.Picked), r.Status)
			}
		}},
		{"whole: no prefill end event; a failure ends it", KindWhole, []step{
			{ms(10), func(tr *Tracker) { tr.PrefillEnd(nil, true) }}, // not a PD route
			{ms(40), func(tr *Tracker) { tr.End(boom) }},
			{ms(40), func(tr *Tracker) { tr.Chunk(5) }}, // after the end: ignored
			{0, func(tr *Tracker) { tr.End(nil) }},
		}, []Phase{PhaseStart, PhaseEnd}, func(t *testing.T, r Route) {
			if !errors.Is(r.Err, boom) || r.TTFT() != 0 || r.Chunks != 0 || r.End.Sub(r.Picked) != ms(50) {
				t.Errorf("err %v ttft %v chunks %d end %v", r.Err, r.TTFT(), r.Chunks, r.End.Sub(r.Picked))
			}
		}},
		{"pd: the prefill leg failed", KindPD, []step{
			{ms(30), func(tr *Tracker) { tr.PrefillEnd(boom, true) }},
			{ms(1), func(tr *Tracker) { tr.End(boom) }},
		}, []Phase{PhaseStart, PhasePrefillEnd, PhaseEnd}, func(t *testing.T, r Route) {
			if !errors.Is(r.PrefillErr, boom) || r.Status != 0 {
				t.Errorf("prefill err %v status %d", r.PrefillErr, r.Status)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := load.NewManualClock(t0)
			rec := NewRecorder(clock)
			var got collect
			rec.Subscribe(&got)
			prefill := ""
			if c.kind == KindPD {
				prefill = "ns/p:8000"
			}
			tr := rec.Start(c.kind, prefill, "ns/d:8000", 1234)
			for _, s := range c.steps {
				clock.Advance(s.after)
				s.do(tr)
			}
			if len(got.evs) != len(c.phases) {
				t.Fatalf("%d events %v, want phases %v", len(got.evs), got.evs, c.phases)
			}
			for i, e := range got.evs {
				if e.Phase != c.phases[i] || e.Route.ID != tr.ID() || e.Route.Kind != c.kind || e.Route.PromptTokens != 1234 {
					t.Errorf("event %d = %s id %d kind %s, want %s id %d", i, e.Phase, e.Route.ID, e.Route.Kind, c.phases[i], tr.ID())
				}
			}
			c.check(t, got.evs[len(got.evs)-1].Route)
		})
	}
}

// A nil recorder records nothing and its nil trackers accept every call; route IDs are
// unique; several readers each see every event.
func TestRecorderBasics(t *testing.T) {
	var nilRec *Recorder
	tr := nilRec.Start(KindWhole, "", "x", 1)
	tr.PrefillEnd(nil, true)
	tr.Response(200, "")
	tr.Chunk(3)
	tr.End(nil)
	if tr.ID() != 0 {
		t.Errorf("nil tracker id %d", tr.ID())
	}
	rec := NewRecorder(nil)
	var a, b collect
	rec.Subscribe(&a)
	rec.Subscribe(&b)
	r1, r2 := rec.Start(KindWhole, "", "x", 1), rec.Start(KindWhole, "", "y", 1)
	if r1.ID() == r2.ID() || r1.ID() == 0 {
		t.Errorf("ids %d %d", r1.ID(), r2.ID())
	}
	r1.End(nil)
	if len(a.evs) != 3 || len(b.evs) != 3 {
		t.Errorf("readers saw %d and %d events, want 3 each", len(a.evs), len(b.evs))
	}
}

// Chunks from concurrent goroutines are all counted and the first byte is published once
// (run with -race).
func TestConcurrentChunks(t *testing.T) {
	rec := NewRecorder(nil)
	var got collect
	rec.Subscribe(&got)
	tr := rec.Start(KindWhole, "", "x", 1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				tr.Chunk(2)
			}
		})
	}
	wg.Wait()
	tr.End(nil)
	first := 0
	var end Route
	for _, e := range got.evs {
		if e.Phase == PhaseFirstByte {
			first++
		}
		if e.Phase == PhaseEnd {
			end = e.Route
		}
	}
	if first != 1 || end.Chunks != 800 || end.Bytes != 1600 {
		t.Errorf("first-byte events %d, chunks %d, bytes %d; want 1, 800, 1600", first, end.Chunks, end.Bytes)
	}
}

// A route is a pair while its leg runs or ran on the prefill pod; served whole, or not PD, not.
func TestPaired(t *testing.T) {
	for _, c := range []struct {
		r    Route
		want bool
	}{
		{Route{Kind: KindPD}, true},
		{Route{Kind: KindPD, PrefillErr: errors.New("refused")}, true},
		{Route{Kind: KindPD, PrefillErr: ErrPrefillNotRun}, false},
		{Route{Kind: KindPD, PrefillErr: fmt.Errorf("leg: %w", ErrPrefillNotRun)}, false},
		{Route{Kind: KindWhole}, false},
	} {
		if got := c.r.Paired(); got != c.want {
			t.Errorf("kind %v leg %v: Paired %v, want %v", c.r.Kind, c.r.PrefillErr, got, c.want)
		}
	}
}
