package extproc

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// Pair-level retry in the epp hand-off. For engines whose prefill leg runs before the decode
// request is forwarded (vLLM, TensorRT-LLM context_first), nothing has reached the client or
// the gateway when that leg fails: Tandem can pick again without the failed prefill pod (another
// pair, a combined pod) and try once more. The failed attempt ends as if it never was a request
// (its lifecycle releases every charge, with ErrAttemptRetried), so ledgers, trackers and
// metrics follow the attempts; x-error-pd-prefill is answered only when the retry fails too.
// Async engines (SGLang, TensorRT-LLM generation_first) have forwarded the decode request by the
// time their prefill leg fails, so they fail fast as before; passive health keeps the next
// requests off the pod.

// RetryObserver is implemented by an Observer that counts pair-level retries
// (tandem_pd_prefill_retries_total).
type RetryObserver interface {
	// PrefillRetry reports one retry decision: RetryRecovered, RetryFailed,
	// RetryBudgetExhausted or RetryNoCandidate.
	PrefillRetry(result string)
}

// Results of a pair-level retry.
const (
	RetryRecovered       = "recovered"        // the second attempt got past its prefill leg
	RetryFailed          = "failed"           // the second attempt's prefill leg failed too
	RetryBudgetExhausted = "budget_exhausted" // no retry: the budget was spent
	RetryNoCandidate     = "no_candidate"     // no retry: nothing to pick without the failed pod
)

// ErrAttemptRetried ends the lifecycle of an attempt that is retried: it releases what the
// attempt held, and is not a failed request.
var ErrAttemptRetried = errors.New("the prefill leg failed and the request was retried on another pick")

// ClassPrefillEjected is the failure class (the apierror Class beside
// handoff.ReasonPrefillFailure) of a prefill leg cancelled because outlier detection ejected its
// pod while it was in flight.
const ClassPrefillEjected = "ejected"

// retryBudget is Envoy's retry budget for pair-level retries: a retry may start while the
// retries in flight stay under budget_percent of the routed requests in flight, and the retries
// of the last minute under budget_percent of the requests of the last minute, neither budget
// ever below min_retry_concurrency.
type retryBudget struct {
	cfg      config.Retry
	active   atomic.Int64 // routed requests in flight
	retrying atomic.Int64 // retries in flight
	recent   *load.Rate   // keys budgetRequests and budgetRetries, over the last minute
}

const (
	budgetRequests = "requests"
	budgetRetries  = "retries"
)

func newRetryBudget(cfg config.Retry) *retryBudget {
	return &retryBudget{cfg: cfg, recent: load.NewRate(nil)}
}

// limit is the budget over n requests.
func (b *retryBudget) limit(n float64) int64 {
	return max(int64(b.cfg.MinRetryConcurrency), int64(math.Floor(n*b.cfg.BudgetPercent/100+1e-9)))
}

// acquire takes a retry slot, or reports that the budget is spent.
func (b *retryBudget) acquire() bool {
	recentRetries := math.Round(b.recent.PerSecond(budgetRetries) * 60)
	if recentRetries >= float64(b.limit(math.Round(b.recent.PerSecond(budgetRequests)*60))) {
		return false
	}
	for {
		n := b.retrying.Load()
		if n >= b.limit(float64(b.active.Load())) {
			return false
		}
		if b.retrying.CompareAndSwap(n, n+1) {
			b.recent.Record(budgetRetries)
			return true
		}
	}
}

func (b *retryBudget) release() { b.retrying.Add(-1) }

// enterActive counts the stream among the routed requests, once.
func (st *stream) enterActive() {
	if !st.active {
		st.active = true
		st.srv.retries.active.Add(1)
		st.srv.retries.recent.Record(budgetRequests)
	}
}

// leaveActive ends the stream's count, once.
func (st *stream) leaveActive() {
	if st.active {
		st.active = false
		st.srv.retries.active.Add(-1)
	}
}

// leaveRetry gives back the stream's retry slot, once.
func (st *stream) leaveRetry() {
	if st.retrying {
		st.retrying = false
		st.srv.retries.release()
	}
}

// retryable says whether a failed prefill leg may be retried on another pick: a transport
// error, a timeout, a 5xx or unusable answer, or the pod ejected mid-flight. A 4xx is the
// request's fault, and a cancelled leg means the client left.
func retryable(e *apierror.Error) bool {
	if e.Header != apierror.HeaderPDPrefill || e.Reason != handoff.ReasonPrefillFailure {
		return false
	}
	switch e.Class {
	case string(handoff.ClassTransport), string(handoff.ClassTimeout), string(handoff.ClassBadResponse), ClassPrefillEjected:
		return true
	case string(handoff.ClassHTTPStatus):
		return e.Status >= 500
	}
	return false
}

func (st *stream) retryObserved(result string) {
	if o, ok := st.srv.obs.(RetryObserver); ok {
		o.PrefillRetry(result)
	}
}

// retryPrefill decides whether a failed attempt is retried and, if so, returns the next
// decision (picked without the failed prefill pod, before the failed attempt lets go of what
// it holds) and its candidates; the failed attempt is then ended. Nil: answer aerr.
func (st *stream) retryPrefill(req *request.Request, d *picker.Decision, cands []*pool.Endpoint, aerr *apierror.Error, attempt int) (*picker.Decision, []*pool.Endpoint) {
	if attempt > 1 {
		if st.retrying {
			st.retryObserved(RetryFailed)
		}
		return nil, nil
	}
	if !st.srv.opts.Retry.PrefillRetry || !st.ho.active() || st.ho.h.Async() || !retryable(aerr) || st.ctx.Err() != nil {
		return nil, nil
	}
	if !st.srv.retries.acquire() {
		st.retryObserved(RetryBudgetExhausted)
		st.log.V(1).Info("prefill leg failed; not retried: the retry budget is spent", "reason", aerr.Reason)
		return nil, nil
	}
	failed := d.Prefill[0]
	next, nextCands, perr := st.pick(req, map[*pool.Endpoint]bool{failed: true})
	if perr != nil {
		st.srv.retries.release()
		st.retryObserved(RetryNoCandidate)
		st.log.V(1).Info("prefill leg failed; not retried: no other pick", "reason", aerr.Reason, "pick", perr.Message)
		return nil, nil
	}
	st.endAttempt(aerr)
	st.retrying, st.firstFailure = true, aerr
	next.Trace.Add("prefill_retry:" + failed.Key())
	st.log.V(1).Info("prefill leg failed; retrying on another pick", "failed", failed.Key(), "reason", aerr.Reason,
		"destination", next.Destination[0].Key())
	return next, nextCands
}

// endAttempt ends a failed attempt that is being retried: its hand-off, its lifecycle (every
// tracker and ledger charge it holds is released) and its outcome record.
func (st *stream) endAttempt(aerr *apierror.Error) {
	st.ho.stop()
	st.ho.h.Done()
	st.ho = eppHandoff{}
	retried := fmt.Errorf("%w: %s", ErrAttemptRetried, aerr.Message)
	st.endRoute(retried)
	if st.lifecycle != nil {
		st.lifecycle.Done(retried)
	}
	st.decision, st.lifecycle, st.finished = nil, nil, true
}

// bothAttempts is the client's error when the retry failed too: the retry's failure, naming
// the first one.
func (st *stream) bothAttempts(aerr *apierror.Error) *apierror.Error {
	if st.firstFailure == nil {
		return aerr
	}
	e := *aerr
	e.Message = fmt.Sprintf("%s (retried once on another pick; the first attempt failed: %s)", aerr.Message, st.firstFailure.Message)
	return &e
}
