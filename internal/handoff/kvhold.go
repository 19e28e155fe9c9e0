package handoff

import (
	"sync"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

// ReleaseResult is what Tandem did for a prefill pod that may hold the KV of a request that
// ended before its decode leg's first token (a metric label).
type ReleaseResult string

// Release results.
const (
	ReleaseSent        ReleaseResult = "sent"        // the prefill pod acknowledged /abort_request (SGLang)
	ReleaseFailed      ReleaseResult = "failed"      // the abort failed or timed out
	ReleaseUnsupported ReleaseResult = "unsupported" // the engine has no call that frees a finished prefill's KV
)

// HoldEnd says how a prefill pod's hold of a finished prefill leg's KV ended (a metric label).
type HoldEnd string

// Hold ends.
const (
	HoldConsumed HoldEnd = "consumed" // the decode leg's first token came: it took the KV
	HoldReleased HoldEnd = "released" // an abort freed it
	HoldExpired  HoldEnd = "expired"  // the hold timeout passed with neither
)

// DefaultKVHoldTimeout is the engines' default hold of a finished prefill's KV: vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT.
const DefaultKVHoldTimeout = 480 * time.Second

// PrefillReleaseTimeout bounds the /abort_request Tandem sends to an SGLang prefill pod.
const PrefillReleaseTimeout = 2 * time.Second

// KVObserver is implemented by an Observer that also measures stranded KV: releases asked of
// prefill pods and how long they held KV. Implementations must be fast and safe for concurrent use.
type KVObserver interface {
	// PrefillRelease reports a request that ended before its decode leg's first token while its
	// prefill pod may hold its KV; engine is the pod's engine label (sglang, vllm, trtllm).
	PrefillRelease(engine string, result ReleaseResult)
	// StrandedKV reports a finished hold: seconds from its start (kvHold) to its end (the hold
	// timeout for HoldExpired).
	StrandedKV(prefill *pool.Endpoint, end HoldEnd, seconds float64)
}

// kvHold is a prefill leg's KV as its prefill pod holds it, until the decode leg's first token,
// an abort, or the hold timeout. It starts at the leg's answer; for SGLang, whose prefill leg
// answers only once the KV was sent, at the leg's start. It reports once.
type kvHold struct {
	obs     KVObserver
	prefill *pool.Endpoint
	start   time.Time
	timeout time.Duration

	mu    sync.Mutex
	ended bool
	timer *time.Timer
}

// beginHold starts measuring a hold on prefill; the hold expires after timeout unless it ends
// first. A nil observer measures nothing (nil hold; its methods are no-ops).
func beginHold(obs KVObserver, prefill *pool.Endpoint, timeout time.Duration) *kvHold {
	if obs == nil || prefill == nil {
		return nil
	}
	if timeout <= 0 {
		timeout = DefaultKVHoldTimeout
	}
	h := &kvHold{obs: obs, prefill: prefill, start: time.Now(), timeout: timeout}
	h.mu.Lock()
	h.timer = time.AfterFunc(timeout, func() { h.end(HoldExpired) })
	h.mu.Unlock()
	return h
}

// cancel ends the hold without reporting it: the prefill leg failed, its pod holds nothing.
func (h *kvHold) cancel() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ended {
		h.ended = true
		h.timer.Stop()
	}
}

// end reports the hold once, with its length (at most the timeout).
func (h *kvHold) end(how HoldEnd) {
	if h == nil {
		return
	}
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return
	}
	h.ended = true
	h.timer.Stop()
	h.mu.Unlock()
	held := min(time.Since(h.start), h.timeout)
	if how == HoldExpired {
		held = h.timeout
	}
	h.obs.StrandedKV(h.prefill, how, held.Seconds())
}
