package handoff

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/handoff/trt"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Observer receives what metrics count. Implementations must be fast and safe for concurrent use.
type Observer interface {
	// PrefillDone reports a finished prefill leg: class is "" on success; stage is
	// "before_response" or "after_response" (the decode leg had already responded).
	PrefillDone(engine string, class FailureClass, stage string, elapsed time.Duration)
	// DecodeAbort reports one /abort_request decision; reason is the prefill failure class or
	// the watchdog's "watchdog_<phase>".
	DecodeAbort(reason string, result AbortResult)
	// Panicked reports a panic recovered in a goroutine of a hand-off ("handoff_prefill",
	// "handoff_abort", "handoff_release"); the request it served failed, the process goes on.
	Panicked(where string)
}

// Stages of a prefill failure relative to the decode leg.
const (
	StageBeforeResponse = "before_response"
	StageAfterResponse  = "after_response"
)

type nopObserver struct{}

func (nopObserver) PrefillDone(string, FailureClass, string, time.Duration) {}
func (nopObserver) DecodeAbort(string, AbortResult)                         {}
func (nopObserver) Panicked(string)                                         {}

// Options are the shared parts of the hand-off; nil fields get working defaults.
type Options struct {
	Executor   *Executor
	Aborter    *Aborter
	ServerInfo *trt.ServerInfoCache
	Observer   Observer
	Log        logr.Logger
	// Now is the clock of TensorRT-LLM ids (nil: time.Now).
	Now func() time.Time
	// KVHoldTimeout bounds a measured hold of a finished prefill leg's KV
	// (TANDEM_PD_KV_HOLD_TIMEOUT_SECONDS; 0: DefaultKVHoldTimeout).
	KVHoldTimeout time.Duration
}

// Adapters holds one adapter per engine and the shared executor, aborter and id sources, and
// builds a Handoff per request. Safe for concurrent use.
type Adapters struct {
	opts      Options
	kvObs     KVObserver // Observer, when it measures stranded KV; else nil
	connector string     // gateway-wide vLLM connector
	vllm      map[string]*VLLM
	sglang    *SGLang
	trt       Engine
	warned    sync.Map // pod key + label value -> struct{}: warn once per bad label
}

// NewAdapters validates the gateway-wide hand-off settings of pd: AIBRIX_TRT_MACHINE_ID must be
// in [0, 1024); an unknown AIBRIX_KV_CONNECTOR_TYPE or AIBRIX_TRT_SCHEDULE_STYLE is logged and
// replaced by its default (shfs, context_first), as the seed does.
func NewAdapters(pd config.PD, opts Options) (*Adapters, error) {
	ids, err := trt.NewIDs(pd.TRTMachineID, opts.Now)
	if err != nil {
		return nil, err
	}
	if opts.Executor == nil {
		opts.Executor = NewExecutor(0)
	}
	if opts.Aborter == nil {
		opts.Aborter = NewAborter(nil, nil)
	}
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	kvObs, _ := opts.Observer.(KVObserver)
	a := &Adapters{opts: opts, kvObs: kvObs, sglang: &SGLang{}, vllm: map[string]*VLLM{
		ConnectorSHFS: {Connector: ConnectorSHFS, Log: opts.Log},
		ConnectorNIXL: {Connector: ConnectorNIXL, Log: opts.Log},
	}}
	a.connector = pd.KVConnectorType
	if _, ok := a.vllm[a.connector]; !ok {
		opts.Log.Info("unknown AIBRIX_KV_CONNECTOR_TYPE, using shfs", "value", pd.KVConnectorType, "valid", "shfs, nixl")
		a.connector = ConnectorSHFS
	}
	switch pd.TRTScheduleStyle {
	case ScheduleGenerationFirst:
		if a.opts.ServerInfo == nil {
			a.opts.ServerInfo = trt.NewServerInfoCache(trt.ServerInfoOptions{Recovered: func(v any, stack []byte) {
				a.opts.Observer.Panicked("handoff_server_info")
				a.opts.Log.Error(fmt.Errorf("panic: %v", v), "recovered a panic in a TensorRT-LLM /server_info lookup; it fails, the process goes on",
					"stack", string(stack))
			}})
		}
		a.trt = &TRTGenerationFirst{IDs: ids, ServerInfo: a.opts.ServerInfo}
	case ScheduleContextFirst, "":
		a.trt = &TRTContextFirst{IDs: ids}
	default:
		opts.Log.Info("unknown AIBRIX_TRT_SCHEDULE_STYLE, using context_first", "value", pd.TRTScheduleStyle,
			"valid", "context_first, generation_first")
		a.trt = &TRTContextFirst{IDs: ids}
	}
	return a, nil
}

// Close releases idle connections.
func (a *Adapters) Close() { a.opts.Executor.Close() }

// For returns the adapter for a prefill pod: its engine label picks the engine, and for vLLM its
// model.aibrix.ai/kv-connector-type label overrides the gateway's connector (an unknown value is
// logged once and ignored).
func (a *Adapters) For(prefill *pool.Endpoint) (Engine, error) {
	switch prefill.Engine {
	case pool.EngineVLLM:
		c, ok := prefill.Labels[pool.LabelKVConnector]
		c = strings.ToLower(c) // AIBrix matches the label in any case
		if !ok || c == "" {
			return a.vllm[a.connector], nil
		}
		if v, ok := a.vllm[c]; ok {
			return v, nil
		}
		if _, seen := a.warned.LoadOrStore(prefill.PodKey()+"="+c, struct{}{}); !seen {
			a.opts.Log.Info("unknown kv connector label, using the gateway's", "pod", prefill.PodKey(),
				"label", pool.LabelKVConnector, "value", c, "using", a.connector, "valid", "shfs, nixl")
		}
		return a.vllm[a.connector], nil
	case pool.EngineSGLang:
		return a.sglang, nil
	case pool.EngineTRTLLM:
		return a.trt, nil
	}
	return nil, badPod(prefill, "%s=%q has no prefill hand-off; use vllm, sglang or trtllm, or the sidecar hand-off",
		pool.LabelEngine, prefill.Engine)
}

// Input is one request's hand-off.
type Input struct {
	Leg
	// Headers are the client's request headers (lower-case), copied onto the prefill leg
	// without hop-by-hop and control headers.
	Headers map[string]string
	// PD is the effective configuration of this request: the gateway's, with the profile's
	// overrides applied (timeouts, abort and watchdog settings).
	PD config.PD
	// PrefillDone, when set, is called once when the prefill HTTP call returns, with nil or the
	// *Failure; wire it to the decision's pd.PrefillObserver so the prefill pod's trackers and
	// ledger charges are released with the leg.
	PrefillDone func(error)
}

// New prepares a request's hand-off: it picks the adapter and builds both bodies. Nothing is sent
// yet, except TensorRT-LLM generation_first's /server_info lookup, whose failure fails the
// request here, before either leg. Errors are *apierror.Error.
func (a *Adapters) New(ctx context.Context, in Input) (*Handoff, error) {
	if in.Prefill == nil || in.Decode == nil {
		return nil, apierror.Internal("pd_no_pair", "the hand-off needs a prefill and a decode endpoint")
	}
	eng, err := a.For(in.Prefill)
	if err != nil {
		return nil, err
	}
	if err := checkAPI(in.API, in.Body); err != nil {
		return nil, err
	}
	if !supports(eng, in.API) {
		return nil, refuseAPI(eng, in.API)
	}
	plan, err := eng.Prepare(ctx, &in.Leg)
	if err != nil {
		return nil, apierror.From(err)
	}
	stopAbort, stopAbortCancel := context.WithCancel(context.Background())
	return &Handoff{a: a, in: in, engine: eng, plan: plan,
		stopAbort: stopAbort, stopAbortCancel: stopAbortCancel,
		failed: make(chan *apierror.Error, 1), succeeded: make(chan struct{}),
	}, nil
}
