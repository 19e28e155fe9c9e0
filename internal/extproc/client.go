package extproc

import (
	"runtime/debug"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
)

// What the gateway on the other end of a stream can do with an answer. The Endpoint Picker
// Protocol lets the destination carry "ip:port[,ip:port…]" (primary, then fallbacks) in the
// header and, with the same value, in the envoy.lb metadata; Envoy-based gateways read either,
// apply every header and body mutation and send the response phase. NGINX Gateway Fabric's
// endpoint-picker shim (v2.6) does none of that: it copies x-gateway-destination-endpoint alone
// into an nginx variable that proxy_pass takes as one host:port ("invalid port in upstream" for
// a list), ignores every other header, the body and the metadata, and never sends the response.

// StepRoutedWhole is appended to the decision step of a PD decision routed whole to its decode
// pod, because the client cannot carry a prefill hand-off.
const StepRoutedWhole = "routed_whole"

// clientKind says, for one stream, whether its client applies only the destination header and
// whether the destination lists fallbacks, from the options and the request headers message.
func (s *Server) clientKind(hs []*corev3.HeaderValue) (destOnly, fallbacks bool) {
	switch s.opts.Client {
	case config.ClientDestinationOnly:
		destOnly = true
	case config.ClientFull:
	default:
		destOnly = destinationOnlyClient(hs)
	}
	switch s.opts.Fallbacks {
	case config.FallbacksOn:
		fallbacks = true
	case config.FallbacksOff:
	default:
		fallbacks = !destOnly
	}
	return destOnly, fallbacks
}

// destinationOnlyClient recognises a client such as NGINX Gateway Fabric's shim: it sends no
// pseudo-header (Envoy always sends :path, :method, :authority and :scheme) and puts header
// values in `value` rather than `raw_value` (Envoy uses raw_value). Both signs are needed: a
// client showing only one is taken as a full ext_proc client.
func destinationOnlyClient(hs []*corev3.HeaderValue) bool {
	inValue := false
	for _, h := range hs {
		if strings.HasPrefix(h.GetKey(), ":") || len(h.GetRawValue()) > 0 {
			return false
		}
		inValue = inValue || h.GetValue() != ""
	}
	return inValue
}

// routeWhole turns a PD decision into one the client can carry: the decode pod serves the
// whole request (vLLM, SGLang and TensorRT-LLM decode pods compute the prompt themselves when
// no KV arrives), no prefill leg runs or is requested (it would be wasted: the client drops
// the hand-off header, metadata and body), and the prefill pod's charges are released at
// once. The trace and the step say so; the outcome becomes combined (one pod, both phases).
func routeWhole(d *picker.Decision) {
	if d.Outcome != picker.OutcomePD || len(d.Prefill) == 0 {
		return
	}
	// The outcome record hears first that no leg runs, whatever the lifecycle can tell it.
	d.Route.PrefillEnd(outcome.ErrPrefillNotRun, false)
	pd.RoutedWhole(d.Lifecycle) // the prefill pod's in-flight count and ledger charges end here
	d.Trace.Add(StepRoutedWhole + ":destination_only_client")
	d.Step += "+" + StepRoutedWhole
	d.Outcome = picker.OutcomeCombined
	d.Prefill = nil
}

// holdUnobserved keeps a routed request's decision charged for Options.DestinationOnlyHold
// after its stream ended, when the client is destination-only and sent no response phase:
// releasing at the end of the stream would make every pod look idle within milliseconds of
// each pick. It reports whether it took over ending the lifecycle.
func (st *stream) holdUnobserved() bool {
	hold := st.srv.opts.DestinationOnlyHold
	if !st.destOnly || hold <= 0 || st.finished || st.rejected || st.lifecycle == nil || st.respHeaders {
		return false
	}
	st.finished = true
	st.leaveRetry()
	// The outcome record ends with the hold too: its readers count the request in flight as
	// the trackers do.
	lc, srv, route := st.lifecycle, st.srv, st.route
	st.route = nil
	time.AfterFunc(hold, func() {
		defer func() {
			if r := recover(); r != nil {
				srv.recovered("extproc_hold", r, debug.Stack())
			}
		}()
		route.End(errUnobserved) // before the lifecycle's: nothing was seen of the answer
		lc.Done(nil)
	})
	return true
}
