package extproc

import (
	"encoding/json"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/proof"
	"github.com/tandem-epp/tandem/internal/wire"
)

// The proof of a PD request's KV transfer (internal/proof): the stream follows the decode
// answer as it passes, and once the answer is complete judges whether the decode pod used the
// transferred KV. The verdict goes on the request's outcome (outcome.Tracker.Transfer), which
// the proof gate reads (lenient policy, tandem_pd_transfer_total); into the decision trace;
// and, opt-in, in the x-tandem-pd-transfer response header, which can be set only when the
// verdict is known before the response headers go out: in the epp hand-off, when the decode
// pod's whole answer arrives in its first body chunk while its headers are held.

// LocalPrefill predicts how long the endpoint (by key) takes to prefill a prompt of tokens
// itself (0: no prediction).
type LocalPrefill func(key string, tokens int) time.Duration

// LatencyPrefill is a LocalPrefill from the latency models' prefill service prediction.
func LatencyPrefill(m *latency.Models) LocalPrefill {
	if m == nil {
		return nil
	}
	return func(key string, tokens int) time.Duration {
		_, service := m.Prefill(key, latency.Prompt{Tokens: tokens})
		if service <= 0 {
			return 0
		}
		return time.Duration(service * float64(time.Second))
	}
}

// transfer is a stream's proof state.
type transfer struct {
	on         bool // a PD route whose decode answer is judged
	sync       bool // the prefill leg ended before the decode leg was forwarded (timing applies)
	scan       proof.Scanner
	prefillLeg time.Duration
	decodeSent time.Time
	firstByte  time.Time
	status     int
	judged     bool
	result     proof.Result
}

// startTransfer begins following a PD decision's decode answer.
func (st *stream) startTransfer(mode string) {
	st.xfer = transfer{on: mode != "" && st.srv.opts.Transfer != nil}
	if st.xfer.on && mode == config.HandoffEPP && st.ho.active() && !st.ho.h.Async() {
		st.xfer.sync = true
	}
	st.xfer.decodeSent = time.Now()
}

// transferChunk feeds a response body chunk to the proof.
func (st *stream) transferChunk(b []byte) {
	if !st.xfer.on || st.xfer.judged {
		return
	}
	if st.xfer.firstByte.IsZero() && len(b) > 0 {
		st.xfer.firstByte = time.Now()
	}
	st.xfer.scan.Write(b)
}

// judgeTransfer judges a complete decode answer, once: a 2xx answer only (a failed one is
// judged by passive health, not here).
func (st *stream) judgeTransfer() (proof.Result, bool) {
	x := &st.xfer
	if !x.on || x.judged || st.decision == nil {
		return x.result, x.judged
	}
	x.judged = true
	if x.status < 200 || x.status > 299 {
		x.on = false
		return "", false
	}
	decode := st.decision.Destination[0]
	if e := st.servedEndpoint(); e != nil {
		decode = e
	}
	gate := st.srv.opts.Transfer
	ev := proof.Evidence{ReportsDetails: gate.ReportsDetails(decode.Key())}
	ev.Usage, ev.HasUsage = x.scan.Usage()
	if ev.HasUsage && ev.Usage.Details {
		gate.SawDetails(decode.Key())
	}
	if x.sync && !x.firstByte.IsZero() {
		ev.DecodeFirstByte = x.firstByte.Sub(x.decodeSent)
		local := x.prefillLeg
		if f := st.srv.opts.LocalPrefill; f != nil && st.promptTokens > 0 {
			local = max(local, f(decode.Key(), st.promptTokens))
		}
		ev.LocalPrefill = local
	}
	res, basis := proof.Judge(ev)
	x.result = res
	st.decision.Trace.Add("pd_transfer:" + string(res) + ":" + basis)
	st.route.Transfer(string(res), basis)
	if l := st.log.V(1); l.Enabled() {
		l.Info("pd transfer judged", "result", res, "basis", basis, "decode", decode.Key(), "prefill", st.decision.Prefill[0].Key(),
			"promptTokens", ev.Usage.Prompt, "cachedTokens", ev.Usage.Cached, "decodeFirstByte", ev.DecodeFirstByte.String(), "localPrefill", ev.LocalPrefill.String())
	}
	return res, true
}

// servedEndpoint is the destination the gateway reported serving, if any.
func (st *stream) servedEndpoint() *pool.Endpoint {
	if st.servedHostPort == "" {
		return nil
	}
	return pool.Served(st.decision.Destination, st.servedHostPort)
}

// transferHeader adds the verdict to a held response headers answer (TANDEM_PD_TRANSFER_HEADER).
func (st *stream) transferHeader(held *extprocv3.ProcessingResponse, res proof.Result) {
	rh, ok := held.Response.(*extprocv3.ProcessingResponse_ResponseHeaders)
	if !ok {
		return
	}
	cr := rh.ResponseHeaders.GetResponse()
	if cr == nil {
		return
	}
	if cr.HeaderMutation == nil {
		cr.HeaderMutation = &extprocv3.HeaderMutation{}
	}
	set := append(cr.HeaderMutation.SetHeaders, headerOption(wire.HeaderPDTransfer, string(res)))
	if st.srv.opts.DebugTraceHeader && st.decision.Trace != nil {
		// The trace went into the held answer without the verdict: the later value wins.
		if b, err := json.Marshal(st.decision.Trace); err == nil {
			set = append(set, headerOption(wire.HeaderTrace, string(b)))
		}
	}
	cr.HeaderMutation.SetHeaders = set
}
