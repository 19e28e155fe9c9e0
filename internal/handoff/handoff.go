package handoff

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// Handoff is one request's PD hand-off, driven by the ext_proc server:
//
//	h, err := adapters.New(ctx, in)      // 400/503 before anything is sent
//	body, aerr := h.Start(streamCtx)     // sync: after the prefill leg; async: at once
//	forward body to the decode pod; select on h.Failed() and h.PrefillSucceeded() (arm the
//	watchdog) while the response flows; call h.DecodeResponded() at the decode leg's first
//	response message, h.DecodeFirstToken() at its first 2xx body chunk, h.AbortDecode(reason)
//	when the watchdog fires, and h.Done() on every path.
type Handoff struct {
	a      *Adapters
	in     Input
	engine Engine
	plan   *Plan

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc // of the prefill leg

	stopAbort       context.Context // cancelled once the decode leg responds: no abort retry after
	stopAbortCancel context.CancelFunc
	failed          chan *apierror.Error
	succeeded       chan struct{}
	responded       atomic.Bool
	completed       atomic.Bool                   // the request completed: an async leg is left to end on its own
	served          atomic.Pointer[pool.Endpoint] // the decode pod answering, when not Input.Decode
	finished        atomic.Bool
	consumed        atomic.Bool // the decode leg's first token came: it took the prefill pod's KV
	prefillFailed   atomic.Bool // the prefill leg failed while the request ran: no KV to release
	hold            *kvHold     // the prefill pod's hold of this leg's KV (under mu); nil if unmeasured
	bg              sync.WaitGroup
	legDone         sync.Once // Input.PrefillDone runs once, even when a panic interrupts the leg
	failOnce        sync.Once // failed receives at most one value
}

// Engine names the adapter, e.g. "sglang".
func (h *Handoff) Engine() string { return h.engine.Name() }

// Async says whether the prefill leg runs concurrently with the decode leg.
func (h *Handoff) Async() bool { return h.plan.Async }

// RID is the SGLang rid on both legs ("" for other engines).
func (h *Handoff) RID() string { return h.plan.RID }

// PrefillBody is the body the prefill leg sends (for traces and contract tests).
func (h *Handoff) PrefillBody() []byte { return h.plan.PrefillBody }

// Start sends the prefill leg on a context derived from ctx, which must live as long as the
// request (the ext_proc stream's context): the client going away cancels the prefill leg.
// Sync engines return the decode body once the prefill leg succeeded, or its failure (status,
// x-error-pd-prefill); async engines return the decode body at once and report a failure on
// Failed. Start runs once.
func (h *Handoff) Start(ctx context.Context) ([]byte, *apierror.Error) {
	h.mu.Lock()
	if h.started || h.finished.Load() {
		h.mu.Unlock()
		return nil, apierror.Internal("pd_handoff_reused", "a hand-off is started once, before Done")
	}
	h.started = true
	if h.plan.Async {
		// The leg outlives ctx only once the request completed: a completed decode leg proves
		// the prefill leg succeeded, and its answer may be on the wire still (Completed).
		parent := ctx
		ctx, h.cancel = context.WithCancel(context.WithoutCancel(ctx))
		cancel := h.cancel
		context.AfterFunc(parent, func() {
			if !h.completed.Load() {
				cancel()
			}
		})
	} else {
		ctx, h.cancel = context.WithCancel(ctx)
	}
	h.mu.Unlock()

	if h.plan.Async {
		h.bg.Add(1)
		go func() {
			defer h.bg.Done()
			h.runAsync(ctx)
		}()
		return h.plan.DecodeBody, nil
	}
	began := time.Now()
	body, f := h.runSync(ctx)
	if f != nil {
		h.a.opts.Observer.PrefillDone(h.engine.Name(), f.Class, StageBeforeResponse, time.Since(began))
		h.log(f)
		return nil, f.APIError()
	}
	h.a.opts.Observer.PrefillDone(h.engine.Name(), "", StageBeforeResponse, time.Since(began))
	h.startHold()
	close(h.succeeded)
	return body, nil
}

func (h *Handoff) call() Call {
	return Call{Target: h.in.Prefill, Path: h.in.prefillPath(), Headers: h.in.Headers, RequestID: h.in.RequestID,
		Body: h.plan.PrefillBody, Timeout: h.in.PD.PrefillRequestTimeout}
}

// prefillPath is where the prefill leg goes: the client's path, or, for a client that sent no
// :path (NGINX Gateway Fabric's shim), the OpenAI path of the API its body names.
func (l Leg) prefillPath() string {
	if l.Path != "" {
		return l.Path
	}
	return request.PathFor(l.API)
}

// prefillDone reports the end of the prefill leg to Input.PrefillDone, once. err is non-nil
// only when the failure ends the request: the decision's lifecycle then releases the request's
// kv and decode charges at once, which must hold for as long as a decode leg runs.
func (h *Handoff) prefillDone(err *Failure) {
	h.legDone.Do(func() {
		if h.in.PrefillDone == nil {
			return
		}
		if err != nil {
			h.in.PrefillDone(err)
		} else {
			h.in.PrefillDone(nil)
		}
	})
}

// fail delivers an async failure, at most once.
func (h *Handoff) fail(e *apierror.Error) {
	h.failOnce.Do(func() { h.failed <- e }) // buffered: never blocks
}

func (h *Handoff) runSync(ctx context.Context) ([]byte, *Failure) {
	resp, f := h.a.opts.Executor.Do(ctx, h.call())
	h.prefillDone(f) // a sync failure always fails the request
	if f != nil {
		h.noteFailure(f)
		return nil, f
	}
	body, err := h.engine.Merge(&h.in.Leg, h.plan, resp)
	if err != nil {
		return nil, &Failure{Class: ClassBadResponse, Err: err}
	}
	return body, nil
}

func (h *Handoff) runAsync(ctx context.Context) {
	defer func() {
		if r := recover(); r != nil {
			h.recovered("handoff_prefill", r)
			h.prefillDone(&Failure{Class: ClassRequestSetup, Err: fmt.Errorf("panic: %v", r)})
			if !h.finished.Load() {
				h.fail(apierror.Panic())
			}
		}
	}()
	// SGLang's prefill leg (the async leg with a rid) answers only once its KV was sent: its
	// pod holds the KV from the leg's start, and a request that ends before the decode pulled
	// it strands it. TensorRT-LLM's generation-first context leg answers once computed.
	if h.plan.RID != "" {
		h.startHold()
	}
	began := time.Now()
	_, f := h.a.opts.Executor.Do(ctx, h.call())
	if f != nil && f.Class == ClassBadResponse && !h.plan.BadResponseFails {
		// SGLang: a 200 means the KV moved; the decode pod can answer whatever the body says.
		h.a.opts.Log.V(1).Info("ignoring an unreadable prefill response", "requestID", h.in.RequestID, "error", f.Err)
		f = nil
	}
	if f == nil {
		h.prefillDone(nil)
		h.a.opts.Observer.PrefillDone(h.engine.Name(), "", StageBeforeResponse, time.Since(began))
		// The hold ends (or starts) before succeeded is closed: whoever waits on it and ends
		// the request sees the KV's state as it is.
		if h.plan.RID != "" {
			// SGLang answered the leg once its KV was sent: the decode pod has it, and its
			// prefill pod nothing left to release.
			h.consume()
		} else {
			h.startHold()
		}
		close(h.succeeded)
		return
	}
	if h.finished.Load() {
		// The request already ended (completed, cancelled or failed another way).
		h.prefillDone(f)
		return
	}
	h.noteFailure(f)
	stage := StageBeforeResponse
	if h.responded.Load() {
		stage = StageAfterResponse
	}
	h.a.opts.Observer.PrefillDone(h.engine.Name(), f.Class, stage, time.Since(began))
	h.log(f, "stage", stage)
	if stage == StageAfterResponse && !h.plan.FailsAfterResponse {
		// SGLang: the decode leg answers on its own; the request is not failed.
		h.prefillDone(nil)
		return
	}
	h.prefillDone(f)
	h.fail(f.APIError())
	if stage == StageBeforeResponse {
		h.abort(string(f.Class), true)
	}
}

// recovered logs a panic recovered in one of the hand-off's goroutines, with its stack, and
// counts it.
func (h *Handoff) recovered(where string, v any) {
	h.a.opts.Observer.Panicked(where)
	h.a.opts.Log.Error(fmt.Errorf("panic: %v", v), "recovered a panic in a prefill/decode hand-off; the request fails, the process goes on",
		"where", where, "requestID", h.in.RequestID, "stack", string(debug.Stack()))
}

func (h *Handoff) log(f *Failure, kv ...any) {
	h.a.opts.Log.Info("prefill leg failed", append([]any{"requestID", h.in.RequestID, "engine", h.engine.Name(),
		"prefill", h.in.Prefill.PodKey(), "class", f.Class, "error", f.Err.Error()}, kv...)...)
}

// Failed delivers an async prefill leg's failure, at most once: before the decode leg responded,
// answer the client with it; after, reset the stream (only TensorRT-LLM generation_first reports
// failures after the decode response; SGLang's are only logged). Nil for sync hand-offs, so a
// select on it never fires.
func (h *Handoff) Failed() <-chan *apierror.Error {
	if !h.plan.Async {
		return nil
	}
	return h.failed
}

// PrefillSucceeded is closed once the prefill leg succeeded: arm the decode watchdog then.
func (h *Handoff) PrefillSucceeded() <-chan struct{} { return h.succeeded }

// PrefillFailed reports that the prefill leg failed on its own (not because the request ended),
// whether or not that failed the request.
func (h *Handoff) PrefillFailed() bool { return h.prefillFailed.Load() }

// DecodeResponded records that the decode leg started responding. From then on no abort retry is
// sent and SGLang prefill failures no longer fail the request.
func (h *Handoff) DecodeResponded() {
	h.responded.Store(true)
	h.stopAbortCancel()
}

// Served records the decode pod the gateway actually sent the decode leg to (a fallback named
// by x-gateway-destination-endpoint-served): it holds the rid, so aborts go there from now on.
func (h *Handoff) Served(decode *pool.Endpoint) {
	if decode != nil {
		h.served.Store(decode)
	}
}

// decodeTarget is the pod an abort goes to: the one that served, else the planned one.
func (h *Handoff) decodeTarget() *pool.Endpoint {
	if e := h.served.Load(); e != nil {
		return e
	}
	return h.in.Decode
}

// AbortDecode asks the decode pod to drop the request with a single /abort_request (SGLang only;
// reason is e.g. the watchdog's Verdict.AbortReason). It returns at once.
func (h *Handoff) AbortDecode(reason string) { h.abort(reason, false) }

func (h *Handoff) abort(reason string, retry bool) {
	if h.plan.RID == "" {
		return // no engine but SGLang has an abort API; its request ends when the stream is reset
	}
	policy := AbortPolicy{Timeout: h.in.PD.DecodeAbortTimeout, RetryDelay: h.in.PD.DecodeAbortRetryDelay}
	h.bg.Add(1)
	go func() {
		defer h.bg.Done()
		defer func() {
			if r := recover(); r != nil {
				h.recovered("handoff_abort", r)
			}
		}()
		target := h.decodeTarget()
		res := h.a.opts.Aborter.Abort(h.stopAbort, target, h.plan.RID, policy, retry)
		h.a.opts.Observer.DecodeAbort(reason, res)
		if res == AbortError {
			h.a.opts.Log.Info("decode abort failed", "requestID", h.in.RequestID, "decode", target.PodKey(), "rid", h.plan.RID)
		}
	}()
}

// DecodeFirstToken records that the decode leg's first token came (its first response body
// chunk with a 2xx status): the decode pod took the prefill pod's KV, whose hold ends
// "consumed", and nothing is released when the request ends. Idempotent.
func (h *Handoff) DecodeFirstToken() { h.consume() }

// consume ends the prefill pod's hold of the KV as consumed: the decode pod has it.
func (h *Handoff) consume() {
	if !h.consumed.CompareAndSwap(false, true) {
		return
	}
	h.mu.Lock()
	hold := h.hold
	h.mu.Unlock()
	hold.end(HoldConsumed)
}

// noteFailure records a prefill leg that failed on its own: its pod holds no KV to release. A
// leg cancelled because the request ended (the client left) is not such a failure: the pod may
// have computed the prompt and hold its KV (SGLang keeps it until the transfer).
func (h *Handoff) noteFailure(f *Failure) {
	if f.Class != ClassCanceled {
		h.prefillFailed.Store(true)
		h.mu.Lock()
		h.hold.cancel()
		h.mu.Unlock()
	}
}

// startHold starts measuring the prefill pod's hold of this leg's KV (kvHold says when),
// unless the decode leg already took it or the request already ended.
func (h *Handoff) startHold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.consumed.Load() || h.finished.Load() || h.hold != nil {
		return
	}
	h.hold = beginHold(h.a.kvObs, h.in.Prefill, h.a.opts.KVHoldTimeout)
}

// engineName is the adapter's engine without its variant: sglang, vllm or trtllm.
func (h *Handoff) engineName() string {
	name, _, _ := strings.Cut(h.engine.Name(), "/")
	return name
}

// releasePrefill runs when the request ended before the decode leg's first token and the
// prefill leg did not fail: the prefill pod may hold the request's KV for nobody. SGLang frees
// it on POST /abort_request {"rid"} (sent off the request path, PrefillReleaseTimeout); vLLM and
// TensorRT-LLM have no such call for a finished request, so their hold runs to the engine's
// own timeout and is counted unsupported.
func (h *Handoff) releasePrefill() {
	h.mu.Lock()
	hold := h.hold
	h.mu.Unlock()
	obs := h.a.kvObs
	if h.plan.RID == "" {
		if hold != nil && obs != nil {
			obs.PrefillRelease(h.engineName(), ReleaseUnsupported)
		}
		return
	}
	h.bg.Add(1)
	go func() {
		defer h.bg.Done()
		defer func() {
			if r := recover(); r != nil {
				h.recovered("handoff_release", r)
			}
		}()
		began := time.Now()
		res := h.a.opts.Aborter.attempt(h.in.Prefill, h.plan.RID, PrefillReleaseTimeout)
		result := ReleaseSent
		if res != AbortOK {
			result = ReleaseFailed
			h.a.opts.Log.Info("prefill release failed: the prefill pod keeps the KV until its own timeout",
				"requestID", h.in.RequestID, "prefill", h.in.Prefill.PodKey(), "rid", h.plan.RID)
		} else {
			hold.end(HoldReleased)
			h.a.opts.Log.V(1).Info("prefill pod released the KV of a request that ended before its first token",
				"requestID", h.in.RequestID, "prefill", h.in.Prefill.PodKey(), "rid", h.plan.RID, "took", time.Since(began).String())
		}
		if obs != nil {
			obs.PrefillRelease(h.engineName(), result)
		}
	}()
}

// Completed records that the request completed (the decode leg's response ended): an async
// prefill leg still running then succeeded (the decode leg could not finish without its KV),
// and Done lets it read its answer, within its own timeout, instead of cancelling it, so its
// success is counted.
func (h *Handoff) Completed() { h.completed.Store(true) }

// Done ends the hand-off on every path (completion, failure, client cancel, watchdog): it cancels
// a prefill leg still running, unless the request Completed, and, when the decode leg's first
// token never came and the prefill leg did not fail, releases the prefill pod's KV
// (releasePrefill). An abort already under way
// finishes on its own timeouts; Wait blocks for it. Done is idempotent.
func (h *Handoff) Done() {
	if !h.finished.CompareAndSwap(false, true) {
		return
	}
	h.mu.Lock()
	if h.cancel != nil && !(h.plan.Async && h.completed.Load()) {
		h.cancel()
	}
	started := h.started
	h.mu.Unlock()
	if started && !h.consumed.Load() && !h.prefillFailed.Load() {
		h.releasePrefill()
	}
}

// Wait blocks until the hand-off's background work (async prefill leg, aborts) has ended or ctx
// is done. Call it after Done (no AbortDecode may race with it); for tests and graceful shutdown.
func (h *Handoff) Wait(ctx context.Context) error {
	ch := make(chan struct{})
	go func() { h.bg.Wait(); close(ch) }()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return errors.New("hand-off background work still running: " + ctx.Err().Error())
	}
}
