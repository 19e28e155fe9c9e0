package handoff

import (
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
)

// wdEvent happens at t seconds after the start.
type wdEvent struct {
	t    float64
	kind string // "arm", "headers", "chunk", "end" (last chunk), "finish"
}

func TestWatchdog(t *testing.T) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	cases := []struct {
		name         string
		stream       bool
		first, resp  float64 // AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT, AIBRIX_DECODE_RESPONSE_TIMEOUT
		idle         float64 // AIBRIX_DECODE_STREAM_IDLE_TIMEOUT
		events       []wdEvent
		wantDeadline float64 // -1: none pending
		fireAt       float64 // checked with Expired at fireAt-0.001 (no) and fireAt (yes); unused if no deadline
		wantPhase    WatchdogPhase
		want504      bool
		wantMsg      string
	}{
		{name: "stream, no headers: 504 after 60 s", stream: true, first: 60, idle: 120,
			events: []wdEvent{{0, "arm"}}, wantDeadline: 60, fireAt: 60, wantPhase: PhaseFirstResponse, want504: true,
			wantMsg: "decode pod ns/decode-0 did not start responding within 1m0s"},
		{name: "stream, headers but no token: headers do not stop the timer; cut", stream: true, first: 60, idle: 120,
			events: []wdEvent{{0, "arm"}, {1, "headers"}}, wantDeadline: 60, fireAt: 60, wantPhase: PhaseFirstResponse},
		{name: "stream, stalls after tokens: idle 120 s after the last chunk; cut", stream: true, first: 60, idle: 120,
			events: []wdEvent{{0, "arm"}, {1, "headers"}, {10, "chunk"}, {100, "chunk"}}, wantDeadline: 220, fireAt: 220,
			wantPhase: PhaseStreamIdle},
		{name: "stream completes: nothing pending", stream: true, first: 60, idle: 120,
			events: []wdEvent{{0, "arm"}, {1, "headers"}, {2, "chunk"}, {3, "end"}}, wantDeadline: -1},
		{name: "not armed (prefill still running): nothing pending", stream: true, first: 60, idle: 120,
			events: []wdEvent{{1, "headers"}}, wantDeadline: -1},
		{name: "chunks before arming count: idle from the last one", stream: true, first: 60, idle: 120,
			events: []wdEvent{{1, "headers"}, {5, "chunk"}, {10, "arm"}}, wantDeadline: 125, fireAt: 125, wantPhase: PhaseStreamIdle},
		{name: "first-response timeout 0 disables that phase only", stream: true, first: 0, idle: 120,
			events: []wdEvent{{0, "arm"}, {1, "headers"}, {30, "chunk"}}, wantDeadline: 150, fireAt: 150, wantPhase: PhaseStreamIdle},
		{name: "first-response timeout 0, no chunk: nothing pending", stream: true, first: 0, idle: 120,
			events: []wdEvent{{0, "arm"}}, wantDeadline: -1},
		{name: "idle timeout 0 disables the idle phase", stream: true, first: 60, idle: 0,
			events: []wdEvent{{0, "arm"}, {1, "headers"}, {2, "chunk"}}, wantDeadline: -1},
		{name: "non-stream: AIBRIX_DECODE_RESPONSE_TIMEOUT 0 (default) disables", stream: false, first: 60, resp: 0, idle: 120,
			events: []wdEvent{{0, "arm"}}, wantDeadline: -1},
		{name: "non-stream with a response timeout: 504 'did not finish'", stream: false, first: 60, resp: 30, idle: 120,
			events: []wdEvent{{0, "arm"}}, wantDeadline: 30, fireAt: 30, wantPhase: PhaseFirstResponse, want504: true,
			wantMsg: "decode pod ns/decode-0 did not finish responding within 30s"},
		{name: "non-stream: the first body chunk ends the watch", stream: false, resp: 30, idle: 120,
			events: []wdEvent{{0, "arm"}, {1, "headers"}, {29, "chunk"}}, wantDeadline: -1},
		{name: "finish disarms", stream: true, first: 60, idle: 120,
			events: []wdEvent{{0, "arm"}, {1, "finish"}}, wantDeadline: -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pd := config.DefaultPD()
			pd.DecodeFirstResponseTimeout, pd.DecodeResponseTimeout, pd.DecodeStreamIdleTimeout = sec(c.first), sec(c.resp), sec(c.idle)
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			at := func(s float64) time.Time { return t0.Add(sec(s)) }
			w := NewWatchdog(pd, "ns/decode-0", pool.EngineSGLang, c.stream)
			for _, e := range c.events {
				switch e.kind {
				case "arm":
					w.Arm(at(e.t))
				case "headers":
					w.Headers()
				case "chunk":
					w.Chunk(at(e.t), false)
				case "end":
					w.Chunk(at(e.t), true)
				case "finish":
					w.Finish()
				}
			}
			d, ok := w.Deadline()
			if c.wantDeadline < 0 {
				if ok {
					t.Fatalf("deadline %s pending, want none", d.Sub(t0))
				}
				if _, fired := w.Expired(at(1e6)); fired {
					t.Fatal("fired with nothing pending")
				}
				return
			}
			if !ok || !d.Equal(at(c.wantDeadline)) {
				t.Fatalf("deadline %s (%v), want %gs", d.Sub(t0), ok, c.wantDeadline)
			}
			if _, fired := w.Expired(at(c.fireAt - 0.001)); fired {
				t.Fatal("fired early")
			}
			v, fired := w.Expired(at(c.fireAt))
			if !fired || v.Phase != c.wantPhase || v.AbortReason != "watchdog_"+string(c.wantPhase) {
				t.Fatalf("verdict %+v fired=%v, want phase %s", v, fired, c.wantPhase)
			}
			if c.want504 {
				if v.Error == nil || v.Error.Status != 504 || v.Error.ErrorHeader() != apierror.HeaderPDDecode || v.Error.Message != c.wantMsg {
					t.Fatalf("error %+v, want 504 %q with %s", v.Error, c.wantMsg, apierror.HeaderPDDecode)
				}
			} else if v.Error != nil {
				t.Fatalf("headers were sent, want a cut stream, got %+v", v.Error)
			}
			if _, again := w.Expired(at(c.fireAt + 1000)); again {
				t.Error("fired twice")
			}
		})
	}
}

// TestWatchdogGuardsOnlyTheConfiguredEngines: armed for SGLang by default; a vLLM or
// TensorRT-LLM decode leg gets no deadline unless TANDEM_DECODE_WATCHDOG_ENGINES names it.
func TestWatchdogGuardsOnlyTheConfiguredEngines(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		engine  string
		engines config.EngineSet
		armed   bool
	}{
		{pool.EngineSGLang, config.DefaultPD().DecodeWatchdogEngines, true},
		{pool.EngineVLLM, config.DefaultPD().DecodeWatchdogEngines, false},
		{pool.EngineTRTLLM, config.DefaultPD().DecodeWatchdogEngines, false},
		{pool.EngineVLLM, config.EngineSetOf(pool.EngineVLLM), true},
		{pool.EngineSGLang, config.EngineSetOf(pool.EngineVLLM), false},
	} {
		pd := config.DefaultPD()
		pd.DecodeWatchdogEngines = c.engines
		w := NewWatchdog(pd, "ns/d", c.engine, true)
		w.Arm(t0)
		_, ok := w.Deadline()
		_, fired := w.Expired(t0.Add(time.Hour))
		if ok != c.armed || fired != c.armed {
			t.Errorf("%s with engines %s: deadline %v, fired %v; want armed=%v", c.engine, c.engines, ok, fired, c.armed)
		}
	}
}
