package handoff

import (
	"fmt"
	"net/http"
	"time"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
)

// WatchdogPhase is what the decode watchdog is waiting for.
type WatchdogPhase string

const (
	// PhaseFirstResponse waits for the decode pod's first response body chunk (not its headers:
	// SGLang sends stream headers before the first token).
	PhaseFirstResponse WatchdogPhase = "first_response"
	// PhaseStreamIdle bounds the gap between two chunks of a stream.
	PhaseStreamIdle WatchdogPhase = "stream_idle"
)

// Watchdog is the decode watchdog of one request, a state machine with no clock or goroutine of
// its own: the ext_proc server feeds it events with the time they happened, asks Deadline when
// to wake up, and calls Expired then. It is armed once the prefill leg succeeded (from then on
// the decode pod owes the client an answer). Not safe for concurrent use.
type Watchdog struct {
	decodePod string
	stream    bool
	// firstTimeout is AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT (streaming) or
	// AIBRIX_DECODE_RESPONSE_TIMEOUT (non-streaming); idleTimeout AIBRIX_DECODE_STREAM_IDLE_TIMEOUT.
	firstTimeout, idleTimeout time.Duration

	armed, headers, finished, fired bool
	chunks                          int
	lastChunk                       time.Time
	phase                           WatchdogPhase
	deadline                        time.Time // zero: no deadline in this phase
}

// NewWatchdog builds the watchdog for a request to decodePod, an engine pod, with the
// effective (profile-overridden) PD config. 0 disables a phase; an engine outside
// pd.DecodeWatchdogEngines (TANDEM_DECODE_WATCHDOG_ENGINES, SGLang by default) disables both:
// only SGLang's prefill leg proves the decode pod took the request, so only there does the decode
// pod owe an answer within a bound; a vLLM or TensorRT-LLM decode pod may queue it legitimately.
func NewWatchdog(pd config.PD, decodePod, engine string, stream bool) *Watchdog {
	w := &Watchdog{decodePod: decodePod, stream: stream}
	if !pd.WatchdogGuards(engine) {
		return w
	}
	w.firstTimeout = pd.DecodeResponseTimeout
	if stream {
		w.firstTimeout, w.idleTimeout = pd.DecodeFirstResponseTimeout, pd.DecodeStreamIdleTimeout
	}
	return w
}

// Served records the decode pod that is answering (the gateway served a fallback): the 504 names it.
func (w *Watchdog) Served(decodePod string) { w.decodePod = decodePod }

// Arm starts the watchdog: the prefill leg succeeded at now. Chunks seen before arming count.
func (w *Watchdog) Arm(now time.Time) {
	if w.armed {
		return
	}
	w.armed = true
	if w.chunks == 0 {
		w.enter(PhaseFirstResponse, now, w.firstTimeout)
		return
	}
	w.enter(PhaseStreamIdle, w.lastChunk, w.idleTimeout)
}

// Headers records that response headers went to the client: from then on a firing watchdog
// can only cut the stream. It does not end the first_response phase.
func (w *Watchdog) Headers() { w.headers = true }

// Chunk records a response body chunk at now. The first one ends first_response; a streaming
// request then waits at most the idle timeout for each next one. End of stream disarms.
func (w *Watchdog) Chunk(now time.Time, endOfStream bool) {
	w.chunks++
	w.lastChunk = now
	if endOfStream || !w.stream {
		// A non-streaming answer is bounded only until it starts arriving.
		w.finished = true
		w.deadline = time.Time{}
		return
	}
	if w.armed {
		w.enter(PhaseStreamIdle, now, w.idleTimeout)
	}
}

// Finish disarms the watchdog (the response completed, or the request ended another way).
func (w *Watchdog) Finish() { w.finished = true; w.deadline = time.Time{} }

func (w *Watchdog) enter(p WatchdogPhase, from time.Time, timeout time.Duration) {
	w.phase = p
	w.deadline = time.Time{}
	if timeout > 0 && !w.finished {
		w.deadline = from.Add(timeout)
	}
}

// Deadline is when the driver should call Expired next; ok is false when nothing is pending.
func (w *Watchdog) Deadline() (at time.Time, ok bool) {
	if !w.armed || w.finished || w.fired || w.deadline.IsZero() {
		return time.Time{}, false
	}
	return w.deadline, true
}

// Verdict is what to do when the watchdog fires.
type Verdict struct {
	Phase   WatchdogPhase
	Timeout time.Duration
	// Error is the 504 to answer with when no headers reached the client yet; nil means the
	// headers are out and the stream must be cut short instead (the client sees a truncated 200).
	Error *apierror.Error
	// AbortReason labels the single /abort_request sent to the decode pod
	// ("watchdog_first_response" or "watchdog_stream_idle").
	AbortReason string
}

// Expired reports whether the watchdog fires at now. It fires at most once.
func (w *Watchdog) Expired(now time.Time) (Verdict, bool) {
	at, ok := w.Deadline()
	if !ok || now.Before(at) {
		return Verdict{}, false
	}
	w.fired = true
	v := Verdict{Phase: w.phase, Timeout: w.firstTimeout, AbortReason: "watchdog_" + string(w.phase)}
	if w.phase == PhaseStreamIdle {
		v.Timeout = w.idleTimeout
	}
	if !w.headers {
		what := "start"
		if !w.stream {
			what = "finish"
		}
		v.Error = &apierror.Error{Status: http.StatusGatewayTimeout, Type: "timeout", Header: apierror.HeaderPDDecode,
			Message: fmt.Sprintf("decode pod %s did not %s responding within %s", w.decodePod, what, v.Timeout),
			Reason:  "pd_decode_watchdog"}
	}
	return v, true
}
