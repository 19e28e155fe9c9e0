package extproc

import (
	"encoding/json"
	"net/http"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/internal/apierror"

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

// PrefillTimes predicts prefill times for the timing evidence.
type PrefillTimes interface {
	// Local is how long the endpoint (by key) takes to prefill a prompt of tokens, its queue
	// left out; 0 while its models have learned nothing (the defaults prove nothing).
	Local(key string, tokens int) time.Duration
	// Wait is how long from now until the prefill leg of the route (its outcome record's ID)
	// starts on the endpoint (by key).
	Wait(route uint64, key string, tokens int) time.Duration
	// Queued reports whether a request sent to the endpoint now waits for one of its slots.
	Queued(key string) bool
}

// LatencyPrefill is PrefillTimes from the latency models' predictions.
func LatencyPrefill(m *latency.Models) PrefillTimes {
	if m == nil {
		return nil
	}
	return latencyPrefill{m}
}

type latencyPrefill struct{ m *latency.Models }

func (l latencyPrefill) Local(key string, tokens int) time.Duration {
	service, ok := l.m.ProofPrefill(key, latency.Prompt{Tokens: tokens})
	if !ok {
		return 0
	}
	return max(time.Duration(service*float64(time.Second)), 0)
}

func (l latencyPrefill) Wait(route uint64, key string, tokens int) time.Duration {
	return max(time.Duration(l.m.PrefillWait(route, key, latency.Prompt{Tokens: tokens})*float64(time.Second)), 0)
}

func (l latencyPrefill) Queued(key string) bool { return l.m.Queued(key) }

// ReasonTransferUnverified is the apierror reason of a request the strict transfer-proof
// policy failed (gateway_request_model_fail_total's status label).
const ReasonTransferUnverified = "pd_transfer_unverified"

// transfer is a stream's proof state.
type transfer struct {
	on   bool // a PD route whose decode answer is judged
	sync bool // the prefill leg ended before the decode leg was forwarded (timing applies)
	// sidecar: the decode pod's routing sidecar runs the prefill leg once the request is
	// forwarded; it was predicted to wait legWait on the prefill pod before its prefill.
	sidecar    bool
	legWait    time.Duration
	queued     bool // the decode pod had requests waiting for a slot when the leg was forwarded
	scan       proof.Scanner
	decodeSent time.Time
	firstByte  time.Time
	status     int
	judged     bool
	result     proof.Result
	strict     bool // TANDEM_PD_TRANSFER_PROOF / routingConfig.transferProof is strict
	noScan     bool // the decode engine's body carries no evidence
}

// startTransfer begins following a PD decision's decode answer.
func (st *stream) startTransfer(mode string) {
	st.xfer = transfer{on: mode != "" && st.srv.opts.Transfer != nil}
	if st.xfer.on && mode == config.HandoffEPP && st.ho.active() && !st.ho.h.Async() {
		st.xfer.sync = true
	}
	if p := st.srv.opts.Prefill; st.xfer.on && p != nil {
		if mode == config.HandoffSidecar && st.route != nil && st.promptTokens > 0 {
			st.xfer.sidecar = true
			st.xfer.legWait = p.Wait(st.route.ID(), st.decision.Prefill[0].Key(), st.promptTokens)
		}
		st.xfer.queued = (st.xfer.sync || st.xfer.sidecar) && p.Queued(st.decision.Destination[0].Key())
	}
	st.xfer.decodeSent = time.Now()
	st.xfer.strict = st.xfer.on && st.decision.PD.TransferProof == config.TransferProofStrict
	// An SGLang decode answer is its own proof: nothing in its body is read.
	st.xfer.noScan = st.xfer.on && st.decision.Destination[0].Engine == pool.EngineSGLang
}

// strictTransfer runs the strict policy on a response body chunk before it is forwarded: once
// the evidence is complete (the body's end, or an event stream's final `data: [DONE]`), a
// transfer that is not verified fails the request. Before the response headers went out the
// client gets a 502 with x-error-pd-decode; after them the stream is cut before its end, so the
// client never sees a complete answer. stop: the chunk must not be forwarded (err ends the
// stream, or the error answer went out).
func (st *stream) strictTransfer(eos bool) (stop bool, err error) {
	x := &st.xfer
	if !x.strict || x.judged || !(eos || x.scan.Done()) {
		return false, nil
	}
	res, ok := st.judgeTransfer()
	if !ok || res == proof.Verified {
		return false, nil
	}
	decode := st.decision.Destination[0]
	if e := st.served; e != nil {
		decode = e
	}
	e := &apierror.Error{Status: http.StatusBadGateway, Type: "server_error", Header: apierror.HeaderPDDecode,
		Reason: ReasonTransferUnverified, Class: string(res),
		Message: "the decode pod " + decode.PodKey() + " answered, but its use of the KV transferred from prefill pod " +
			st.decision.Prefill[0].PodKey() + " is " + string(res) + " (transfer proof strict: see docs/proof.md); the answer was withheld"}
	st.log.Info("strict transfer proof failed the request", "result", res, "decode", decode.Key(), "headersSent", st.respSent || st.ho.sent)
	if st.ho.held != nil {
		st.ho.held = nil // the decode pod's headers never go out: the client gets the error instead
		_, err := st.failRouted(e)
		return true, err
	}
	st.ho.stop()
	st.finish(e)
	return true, status.Error(codes.Aborted, e.Message)
}

// transferChunk feeds a response body chunk to the proof.
func (st *stream) transferChunk(b []byte) {
	if !st.xfer.on || st.xfer.judged {
		return
	}
	if st.xfer.firstByte.IsZero() && len(b) > 0 {
		st.xfer.firstByte = time.Now()
	}
	if !st.xfer.noScan {
		st.xfer.scan.Write(b)
	}
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
	if e := st.served; e != nil {
		decode = e
	}
	if decode.Role != pool.RoleDecode {
		// A combined fallback served it whole: no transfer to judge.
		x.on = false
		return "", false
	}
	gate := st.srv.opts.Transfer
	ev := proof.Evidence{Engine: decode.Engine, CountsTransfers: gate.CountsTransfers(decode.Key(), proof.EngineGroup(decode.Model, decode.Revision))}
	if decode.Engine == pool.EngineSGLang && st.ho.active() && st.ho.h.Async() {
		ev.PrefillUnsent = st.sglangLegUnsent()
	}
	ev.Usage, ev.HasUsage = x.scan.Usage()
	prefill := st.decision.Prefill[0].Key()
	if p := st.srv.opts.Prefill; (x.sync || x.sidecar) && p != nil && !x.firstByte.IsZero() && x.scan.Streamed() && st.promptTokens > 0 {
		// What a local prefill of the prompt costs, from the pod that prefilled it: the leg's
		// measured duration (epp hand-off), else its prediction there. Not the decode pod's
		// own model: in PD it never prefills a prompt itself, and what its engine reports as
		// prefill time is its decode legs' KV loads (or recomputes).
		ev.DecodeFirstByte = x.firstByte.Sub(x.decodeSent)
		ev.PrefillService = p.Local(prefill, st.promptTokens)
		ev.LocalPrefill = st.prefillLeg
		if ev.LocalPrefill <= 0 {
			ev.LocalPrefill = ev.PrefillService
		}
		ev.DecodeQueued = x.queued || p.Queued(decode.Key())
		if x.sidecar {
			// The leg: its predicted wait when it was forwarded, and the prefill as the models
			// know it now (they may have learned it since).
			ev.Sidecar = true
			if ev.PrefillService > 0 {
				ev.PrefillLeg = x.legWait + ev.PrefillService
			}
			ev.PeerLate, ev.HasPeers = gate.PeerLate(prefill, decode.Key(), func(l proof.LegSample) (float64, bool) {
				service := p.Local(prefill, l.Tokens)
				if service <= 0 {
					return 0, false
				}
				e := proof.Evidence{DecodeFirstByte: l.FirstByte, PrefillLeg: l.Wait + service, LocalPrefill: service}
				return e.Late(), true
			})
		}
	}
	res, basis := proof.Judge(ev)
	if res == proof.Verified && basis == proof.BasisUsage && ev.Usage.WholePrompt() {
		gate.SawTransfer(decode.Key(), proof.EngineGroup(decode.Model, decode.Revision))
	}
	if ev.Sidecar && !ev.DecodeQueued {
		gate.AddLeg(prefill, proof.LegSample{Decode: decode.Key(), Tokens: st.promptTokens, Wait: x.legWait, FirstByte: ev.DecodeFirstByte})
	}
	x.result = res
	st.decision.Trace.Add("pd_transfer:" + string(res) + ":" + basis)
	st.route.Transfer(string(res), basis)
	if l := st.log.V(1); l.Enabled() {
		l.Info("pd transfer judged", "result", res, "basis", basis, "decode", decode.Key(), "prefill", prefill,
			"promptTokens", ev.Usage.Prompt, "cachedTokens", ev.Usage.Cached, "decodeFirstByte", ev.DecodeFirstByte.String(),
			"prefillLeg", ev.PrefillLeg.String(), "localPrefill", ev.LocalPrefill.String(), "prefillService", ev.PrefillService.String(),
			"decodeQueued", ev.DecodeQueued, "late", ev.Late(), "peerLate", ev.PeerLate, "hasPeers", ev.HasPeers)
	}
	return res, true
}

// sglangLegGrace is how long judging waits for an SGLang prefill leg's answer after its decode
// answer ended: the leg answers once the KV was sent, and that answer may come a moment after a
// short decode answer (they race on two connections). Strict waits long, since its verdict
// decides whether the answer is served; lenient holds the answer's end only briefly, since a
// leg not answered by then only makes the verdict unknown.
const (
	sglangLegGrace        = 2 * time.Second
	sglangLenientLegGrace = 100 * time.Millisecond
)

// sglangLegUnsent reports whether the SGLang prefill leg Tandem ran had not answered (sent the
// KV) when the decode answer ended.
func (st *stream) sglangLegUnsent() bool {
	h := st.ho.h
	select {
	case <-h.PrefillSucceeded():
		return false
	default:
	}
	if h.PrefillFailed() {
		return true
	}
	grace := sglangLenientLegGrace
	if st.xfer.strict {
		grace = sglangLegGrace
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-h.PrefillSucceeded():
		return false
	case <-t.C:
		return true
	}
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
