package handoffe2e

import (
	"context"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/sim"
)

// failureCase is one failure injected through the simulator's X-Sim-Fault header, and what the
// client and the pods must see.
type failureCase struct {
	name   string
	fault  string // X-Sim-Fault: role-prefixed so it hits one leg only
	pd     string // the profile's routingConfig.pd overrides (JSON, seconds)
	stream bool
	// wantStatus is the client's status; 200 with cut means a truncated stream.
	wantStatus int
	cut        bool
	// wantHeader is the error marker header ("" for none); wantMsg a part of the error message.
	wantHeader, wantMsg string
	// metric that must count exactly one (name and labels), besides the trackers at zero.
	metric string
	labels map[string]string
	// sglangAborts is how many /abort_request calls an SGLang decode pod gets (0: none).
	sglangAborts int
}

// Timeouts are whole seconds (the seed's settings are integers). The decode cases opt every
// engine into the watchdog (by default it guards SGLang only).
const fast = `{"prefillRequestTimeout":1}`

var failureCases = []failureCase{
	{name: "prefill 5xx", fault: "prefill-503", pd: `{"decodeAbortRetryDelay":1}`,
		wantStatus: 503, wantHeader: "x-error-pd-prefill", wantMsg: "prefill request failed (http_status)",
		metric: "gateway_request_model_fail_total", labels: map[string]string{"status": "pd_prefill_failure", "class": "http_status", "status_code": "503"},
		sglangAborts: 2},
	{name: "prefill timeout", fault: "prefill-slow-5s", pd: fast, stream: true,
		wantStatus: 503, wantHeader: "x-error-pd-prefill", wantMsg: "prefill request failed (timeout)",
		metric: "gateway_pd_prefill_failure_total", labels: map[string]string{"class": "timeout", "stage": "before_response"},
		sglangAborts: 1},
	{name: "prefill hang", fault: "prefill-hang", pd: fast,
		wantStatus: 503, wantHeader: "x-error-pd-prefill", wantMsg: "prefill request failed (timeout)",
		metric: "gateway_pd_prefill_failure_total", labels: map[string]string{"class": "timeout", "stage": "before_response"},
		sglangAborts: 1},
	{name: "decode hang before first token, streaming", fault: "decode-hang", stream: true,
		pd:         `{"decodeFirstResponseTimeout":1,"decodeWatchdogEngines":"sglang,vllm,trtllm"}`,
		wantStatus: 504, wantHeader: "x-error-pd-decode", wantMsg: "did not start responding",
		metric: "gateway_request_model_fail_total", labels: map[string]string{"status": "pd_decode_watchdog", "status_code": "504"},
		sglangAborts: 1},
	{name: "decode hang before first token, whole answer", fault: "decode-hang",
		pd:         `{"decodeResponseTimeout":1,"decodeWatchdogEngines":"sglang,vllm,trtllm"}`,
		wantStatus: 504, wantHeader: "x-error-pd-decode", wantMsg: "did not finish responding",
		metric: "gateway_pd_decode_watchdog_total", labels: map[string]string{"phase": "first_response"},
		sglangAborts: 1},
	{name: "decode stall mid-stream", fault: "decode-hang-after-3", stream: true,
		pd:         `{"decodeStreamIdleTimeout":1,"decodeWatchdogEngines":"sglang,vllm,trtllm"}`,
		wantStatus: 200, cut: true,
		metric: "gateway_request_model_fail_total", labels: map[string]string{"status": "pd_decode_watchdog", "status_code": "504"},
		sglangAborts: 1},
}

// failureVariants are the engines' hand-off flavours the failures run against.
var failureVariants = []variant{variants[0], variants[1], variants[3], variants[4], variants[5]}

func TestEPPHandoffFailures(t *testing.T) {
	for _, v := range failureVariants {
		for _, fc := range failureCases {
			t.Run(v.name+"/"+fc.name, func(t *testing.T) {
				t.Parallel() // most of each case is waiting for a timeout
				// The profile, not the gateway, asks for the epp hand-off and the short timeouts.
				env := eppEnv(v.env)
				delete(env, "TANDEM_PD_HANDOFF")
				st := newStack(t, stackOptions{engine: v.engine, env: env, prefillLabels: v.labels,
					routing: `{"handoff":"epp","pd":` + fc.pd + `}`})
				ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
				defer cancel()
				c := clientCase{chat: true, stream: fc.stream}
				r := st.post(ctx, c.path(), c.body(), map[string]string{sim.HeaderFault: fc.fault})
				if r.status != fc.wantStatus {
					t.Fatalf("status %d, want %d: %s", r.status, fc.wantStatus, r.body)
				}
				if fc.cut != (r.readErr != nil) {
					t.Errorf("cut short = %v (read error %v), want %v; body %q", r.readErr != nil, r.readErr, fc.cut, r.body)
				}
				if fc.cut && r.text() == "" {
					t.Errorf("the stalled stream delivered no token before the cut: %q", r.body)
				}
				if fc.wantHeader != "" {
					if got := r.header.Get(fc.wantHeader); got != "true" {
						t.Errorf("%s = %q, want true (headers %v)", fc.wantHeader, got, r.header)
					}
					if msg := gjson.GetBytes(r.body, "error.message").Str; !strings.Contains(msg, fc.wantMsg) {
						t.Errorf("error message %q, want it to contain %q", msg, fc.wantMsg)
					}
				}
				if strings.HasPrefix(fc.fault, "prefill-") && v.engine != sim.EngineSGLang && v.name != "trtllm-generation-first" {
					// Sync engines send the decode leg only after a successful prefill.
					if n := len(inferences(st.decode)); n != 0 {
						t.Errorf("the decode pod got %d requests after a failed prefill", n)
					}
				}
				if !eventually(func() bool { return st.counter(fc.metric, fc.labels) == 1 }) {
					t.Errorf("%s%v = %v, want 1", fc.metric, fc.labels, st.counter(fc.metric, fc.labels))
				}
				// One failed request is one failure, whatever a retry tried in between (a re-pick
				// that finds no other pair is not a second failed request).
				if n := st.counter("gateway_request_model_fail_total", nil); n != 1 {
					t.Errorf("gateway_request_model_fail_total (every label) = %v, want 1", n)
				}
				if v.engine == sim.EngineSGLang {
					// The rid is on both legs; the decode leg may not have reached its pod when a
					// prefill failure ended the request.
					rids, err := waitAborts(ctx, st.decode, fc.sglangAborts)
					pre := inferences(st.prefill)
					if err != nil || len(pre) == 0 {
						t.Fatalf("decode pod aborts %q (want %d), %d prefill legs: %v", rids, fc.sglangAborts, len(pre), err)
					}
					rid := gjson.GetBytes(pre[0].Body, "rid").Str
					for _, got := range rids {
						if got != rid {
							t.Errorf("abort for rid %q, the decode leg's rid is %q", got, rid)
						}
					}
					ok := map[string]string{"result": "ok"}
					if !eventually(func() bool { return st.counter("gateway_pd_decode_abort_total", ok) == 1 }) {
						t.Errorf("gateway_pd_decode_abort_total{result=ok} = %v, want 1", st.counter("gateway_pd_decode_abort_total", ok))
					}
				}
			})
		}
	}
}

// TestEPPHandoffClientCancel: a client that goes away while the prefill leg runs cancels it
// (the prefill pod sees its request end), and everything Tandem charged is released.
func TestEPPHandoffClientCancel(t *testing.T) {
	for _, v := range failureVariants {
		t.Run(v.name, func(t *testing.T) {
			st := newStack(t, stackOptions{engine: v.engine, env: eppEnv(v.env), prefillLabels: v.labels})
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			reqCtx, cancelReq := context.WithCancel(ctx)
			done := make(chan reply, 1)
			c := clientCase{chat: true, stream: true}
			go func() {
				done <- st.post(reqCtx, c.path(), c.body(), map[string]string{sim.HeaderFault: "prefill-hang"})
			}()
			// The prefill leg is running (and hangs) once the prefill pod admitted it.
			if _, err := st.prefill.WaitStats(ctx, func(s sim.Stats) bool { return s.Running == 1 }); err != nil {
				t.Fatal(err)
			}
			cancelReq()
			if r := <-done; r.readErr == nil {
				t.Fatalf("the cancelled request completed: %d %s", r.status, r.body)
			}
			if _, err := st.prefill.WaitStats(ctx, func(s sim.Stats) bool { return s.Running == 0 && s.Waiting == 0 }); err != nil {
				t.Fatalf("the prefill leg was not cancelled: %v", err)
			}
			if !eventually(func() bool {
				return st.counter("gateway_pd_prefill_failure_total", map[string]string{"class": "canceled"}) == 1 ||
					v.engine == sim.EngineSGLang || v.name == "trtllm-generation-first"
			}) {
				t.Error("the cancelled prefill leg was not counted as class canceled")
			}
		})
	}
}
