package app

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/telemetry"
)

// tel connects the components' observer hooks to Tandem's own metrics and logs.
type tel struct {
	m   *telemetry.Metrics
	log logr.Logger
	// podWarning, when the pool comes from Kubernetes, records a Warning event on a pod (a bad
	// annotation). Set before serving starts; a forbidden write is logged, never fatal.
	podWarning func(namespace, name, reason, message string)
}

func newTelemetry(reg prometheus.Registerer, log logr.Logger) (*tel, error) {
	m, err := telemetry.New(reg)
	if err != nil {
		return nil, err
	}
	return &tel{m: m, log: log}, nil
}

// annotationReporter logs a bad model.aibrix.ai/config annotation and counts it. A bad field is
// left out and the rest of the annotation applies; an annotation that is not usable at all
// (field is the annotation itself) says in its problem what applies instead: the pod's last
// good config, else the gateway defaults.
func (t *tel) annotationReporter() config.Reporter {
	return config.ReporterFunc(func(podKey, field, value string, err error) {
		ns, name := splitPodKey(podKey)
		t.m.PodConfigError(ns, name, "annotation")
		what, consequence := pool.AnnotationConfig+" field "+field, "; the field is left out, the rest of the annotation applies"
		if field == pool.AnnotationConfig {
			what, consequence = pool.AnnotationConfig, "" // err says what applies instead
		}
		// A configuration mistake, not a failure of Tandem: a warning line without a stack trace.
		t.log.Info("WARNING: bad pod annotation "+pool.AnnotationConfig+consequence,
			"pod", podKey, "field", field, "value", value, "problem", err.Error())
		if t.podWarning != nil {
			t.podWarning(ns, name, "BadRoutingConfig",
				fmt.Sprintf("%s=%q: %v%s", what, value, err, consequence))
		}
	})
}

func (t *tel) sourceError(kind string, err error) {
	t.log.Error(err, "pool source rejected an update; keeping the last good pool", "source", kind)
}

func (t *tel) extprocObserver() extproc.Observer { return &extprocObserver{m: t.m} }

// grpcRecovered logs and counts a panic that escaped a gRPC handler (serving's outer net).
func (t *tel) grpcRecovered(method string, v any, stack []byte) {
	t.m.PanicRecovered("grpc")
	t.log.Error(fmt.Errorf("panic: %v", v), "recovered a panic in a gRPC handler; that call failed, the process goes on",
		"method", method, "stack", string(stack))
}

// extprocObserver adapts extproc.Observer to telemetry.Metrics.
type extprocObserver struct {
	m      *telemetry.Metrics
	mu     sync.Mutex
	closes []func()
}

func (o *extprocObserver) StreamOpened() {
	done := o.m.StreamOpened()
	o.mu.Lock()
	o.closes = append(o.closes, done)
	o.mu.Unlock()
}

func (o *extprocObserver) StreamClosed() {
	o.mu.Lock()
	var done func()
	if n := len(o.closes); n > 0 {
		done = o.closes[n-1]
		o.closes = o.closes[:n-1]
	}
	o.mu.Unlock()
	if done != nil {
		done()
	}
}

func (o *extprocObserver) RequestBody(n int) { o.m.RequestBody(n) }

func (o *extprocObserver) Decided(e extproc.DecisionEvent) {
	o.m.Decision(e.Strategy, telemetry.Outcome(e.Outcome), e.Step, e.Latency)
}

func (o *extprocObserver) RequestFailed(status int, reason string) {
	o.m.Decision("", telemetry.OutcomeError, reason, 0)
}

func (o *extprocObserver) Panicked(where string) { o.m.PanicRecovered(where) }

func (o *extprocObserver) FieldsRemoved(fields []string) { o.m.ClientFieldsRemoved(fields) }

// observedScheduler wraps the router so every decision feeds the per-request metrics: the
// selected pair, time to first token and inter-token latency on the response stream, and the
// seed's gateway_request_model_fail_total on failures.
type observedScheduler struct {
	inner  picker.Scheduler
	m      *telemetry.Metrics
	models atomic.Pointer[modelIndex] // of the last snapshot seen
}

func (s *observedScheduler) Schedule(ctx context.Context, req *request.Request, snap *pool.Snapshot, cands []*pool.Endpoint) (*picker.Decision, error) {
	start := time.Now()
	declared, named := s.modelOf(snap, req.Model)
	d, err := s.inner.Schedule(ctx, req, snap, cands)
	if err != nil {
		if !picker.IsRetry(ctx) { // a retry's failed pick leaves the request with its first failure, counted once
			ae := apierror.From(err)
			s.m.RequestModelFail(s.m.ModelLabel(req.Model, declared), "gateway_req_body_fail", "", ae.Status)
		}
		return nil, err
	}
	if len(d.Prefill) > 0 && len(d.Destination) > 0 {
		s.m.SelectedPair(d.Prefill[0], d.Destination[0])
	}
	countFiltered(s.m, d.Trace)
	if len(d.Destination) > 0 {
		d.Lifecycle = &timedLifecycle{inner: d.Lifecycle, m: s.m, model: req.Model, declared: declared,
			learn: !named, role: d.Destination[0].Role, start: start}
	}
	return d, nil
}

// modelOf says whether a pod of the snapshot names model as the one it serves (declared), and
// whether any pod names a model at all (named). In a pool whose pods name none, a model becomes
// a label value once it was answered successfully. The snapshot's model set is built once.
func (s *observedScheduler) modelOf(snap *pool.Snapshot, model string) (declared, named bool) {
	idx := s.models.Load()
	if idx == nil || idx.snap != snap {
		idx = &modelIndex{snap: snap, models: map[string]bool{}}
		for _, e := range snap.Endpoints {
			if e.Model != "" {
				idx.models[e.Model] = true
			}
		}
		s.models.Store(idx)
	}
	return idx.models[model], len(idx.models) > 0
}

// modelIndex is the set of models a snapshot's pods name.
type modelIndex struct {
	snap   *pool.Snapshot
	models map[string]bool
}

// timedLifecycle observes the response stream for TTFT and inter-token latency. Its model
// label is fixed when the response status is known (a success teaches an unnamed pool's model).
type timedLifecycle struct {
	inner    picker.Lifecycle
	timer    *telemetry.ResponseTimer
	m        *telemetry.Metrics
	model    string
	declared bool // a pod names the model
	learn    bool // no pod names any model: a successful answer makes the name a label value
	role     pool.Role
	start    time.Time
	status   int
}

func (l *timedLifecycle) label() string { return l.m.ModelLabel(l.model, l.declared) }

func (l *timedLifecycle) ResponseHeaders(status int, served *pool.Endpoint) {
	l.status = status
	if l.learn && status > 0 && status < 400 {
		l.m.ModelServed(l.model)
	}
	l.timer = l.m.NewResponseTimer(l.label(), l.role, l.start)
	if l.inner != nil {
		l.inner.ResponseHeaders(status, served)
	}
}

func (l *timedLifecycle) ResponseBody(size int, eos bool) {
	if l.timer != nil && (l.status == 0 || l.status < 400) {
		l.timer.BodyChunk(time.Now(), size)
	}
	if l.inner != nil {
		l.inner.ResponseBody(size, eos)
	}
}

func (l *timedLifecycle) Done(err error) {
	var ae *apierror.Error
	switch {
	case errors.Is(err, extproc.ErrAttemptRetried):
		// An attempt retried on another pick is not a failed request; the retry's end counts.
	case errors.As(err, &ae) && ae.Status >= 400:
		// Tandem ended the request itself (PD hand-off: prefill failure, decode watchdog).
		l.m.RequestModelFail(l.label(), ae.Reason, ae.Class, ae.Status)
	case l.status >= 400:
		l.m.RequestModelFail(l.label(), "upstream_error", "", l.status)
	case err != nil && !errors.Is(err, context.Canceled):
		l.m.RequestModelFail(l.label(), "stream_error", "", 500)
	}
	if l.inner != nil {
		l.inner.Done(err)
	}
}

func splitPodKey(k string) (ns, name string) {
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			return k[:i], k[i+1:]
		}
	}
	return "", k
}
