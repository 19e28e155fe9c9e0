package app

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// The "epp" PD hand-off's telemetry, and what end-to-end tests read of a running App.

// handoffObserver feeds the hand-off's prefill outcomes and decode aborts to the metrics.
func (t *tel) handoffObserver() handoff.Observer { return handoffObserver{t} }

type handoffObserver struct{ t *tel }

func (o handoffObserver) PrefillDone(_ string, class handoff.FailureClass, stage string, _ time.Duration) {
	if class == "" {
		o.t.m.PrefillRequestSuccess()
		return
	}
	o.t.m.PrefillFailure(string(class), stage)
	code := 503
	if class == handoff.ClassHTTPStatus {
		code = 502 // the engine's own status is in the client's answer and the logs
	}
	o.t.m.PrefillRequestFail("pd-prefill-"+string(class), code)
}

func (o handoffObserver) DecodeAbort(reason string, result handoff.AbortResult) {
	o.t.m.DecodeAbort(reason, string(result))
}

func (o handoffObserver) Panicked(where string) { o.t.m.PanicRecovered(where) }

// PrefillRelease implements handoff.KVObserver.
func (o handoffObserver) PrefillRelease(engine string, result handoff.ReleaseResult) {
	o.t.m.PrefillRelease(engine, string(result))
}

// StrandedKV implements handoff.KVObserver.
func (o handoffObserver) StrandedKV(prefill *pool.Endpoint, end handoff.HoldEnd, seconds float64) {
	o.t.m.StrandedKV(prefill, string(end), seconds)
}

var _ handoff.KVObserver = handoffObserver{}

// DecodeWatchdog implements extproc.HandoffObserver.
func (o *extprocObserver) DecodeWatchdog(_, phase string) { o.m.DecodeWatchdog(phase) }

// PrefillDone implements pd.PrefillObserver: the wrapped PD lifecycle releases the prefill
// pod's trackers and ledger charges when the hand-off's prefill leg returns.
func (l *timedLifecycle) PrefillDone(err error) {
	if po, ok := l.inner.(pd.PrefillObserver); ok {
		po.PrefillDone(err)
	}
}

// RoutedWhole implements pd.WholeRouter: the wrapped PD lifecycle learns its pair runs whole.
func (l *timedLifecycle) RoutedWhole() { pd.RoutedWhole(l.inner) }

var (
	_ pd.PrefillObserver = (*timedLifecycle)(nil)
	_ pd.WholeRouter     = (*timedLifecycle)(nil)
)

// Deps are the picker's shared counters (requests running per endpoint), for tests that
// check every path releases what it took.
func (a *App) Deps() *picker.Deps { return a.deps }

// Health is passive health (outlier detection).
func (a *App) Health() *health.Detector { return a.health }

// Cascade is the PD strategy: its prefill and pending-decode trackers.
func (a *App) Cascade() *pd.Cascade { return a.cascade }

// TokenLoad is the token-load policies' ledgers.
func (a *App) TokenLoad() *pd.TokenLoad { return a.tokens }

// Gatherer reads Tandem's metrics in-process.
func (a *App) Gatherer() prometheus.Gatherer { return a.reg }
