package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/extproc"
)

// route sends one request on a fresh stream and reads Tandem's answer to it.
func route(t *testing.T, c *envoy.Client, ctx context.Context, req envoy.Request) (*envoy.Stream, *envoy.Routed) {
	t.Helper()
	s, r, err := c.Route(ctx, req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Path, req.Body, err)
	}
	return s, r
}

// dialSynced waits for the app's pool and connects an ext_proc client, closed with the test.
func dialSynced(t *testing.T, a *App) (*envoy.Client, context.Context) {
	t.Helper()
	waitSynced(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	c, err := envoy.Dial(a.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, ctx
}

func chat(model string) envoy.Request {
	return envoy.Request{Method: "POST", Path: "/v1/chat/completions",
		Body: []byte(`{"model":"` + model + `","messages":[{"role":"user","content":"hello"}]}`)}
}

// TestOneClientCannotKillTheProcess drives the EPP wired as cmd/epp wires it (production
// telemetry, the real router) with the strings that used to end the process: a model holding
// an invalid UTF-8 byte panicked in the Prometheus client (issue 11, defect 1), and so could
// every client string that becomes a label, a log field or a header. Each request gets an
// answer, and the next one is routed.
func TestOneClientCannotKillTheProcess(t *testing.T) {
	a := startApp(t, "--endpoints-file="+writePool(t, pdPool), "--zap-log-level=debug")
	c, ctx := dialSynced(t, a)
	bad := "sim\xff" + strings.Repeat("\xc3", 3)
	long := strings.Repeat("x", 64<<10)
	cases := []struct {
		name   string
		req    envoy.Request
		status int // 0: routed
	}{
		{"model with an invalid UTF-8 byte", chat(bad), 400},
		{"the same on a route Tandem does not validate", envoy.Request{Method: "POST", Path: "/v1/embeddings",
			Body: []byte(`{"model":"` + bad + `","input":"x"}`)}, 0},
		{"a 64 KiB model", chat(long), 0},
		{"routing-strategy not UTF-8", withHeaders(chat("m"), "routing-strategy", bad), 400},
		{"routing-strategy of 64 KiB", withHeaders(chat("m"), "routing-strategy", long), 400},
		{"config-profile, session key, request id not UTF-8", withHeaders(chat("m"),
			"config-profile", bad, "x-aibrix-session-key", bad, "x-request-id", bad), 0},
		{"a 64 KiB request id and session key", withHeaders(chat("m"), "x-request-id", long, "x-aibrix-session-key", long), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, r := route(t, c, ctx, tc.req)
			switch {
			case tc.status == 0 && r.Immediate != nil:
				t.Fatalf("answered %d %s, want it routed", r.Immediate.Status, r.Immediate.Body)
			case tc.status != 0 && (r.Immediate == nil || r.Immediate.Status != tc.status):
				t.Fatalf("got %+v, want a %d", r, tc.status)
			}
			if _, r := route(t, c, ctx, chat("m")); r.Immediate != nil || len(r.Endpoints()) == 0 {
				t.Fatalf("the next request: %+v", r)
			}
		})
	}
	if text := scrape(t, a); !strings.Contains(text, "tandem_decisions_total") {
		t.Fatal("/metrics no longer answers")
	}
}

func withHeaders(r envoy.Request, kv ...string) envoy.Request {
	r.Headers = append(r.Headers, envoy.Headers(kv...)...)
	return r
}

// TestModelLabelsStayBounded: a model the pool does not serve is one label value ("other"),
// not one series per name a client invents; the pool's own model keeps its name.
func TestModelLabelsStayBounded(t *testing.T) {
	a := startApp(t, "--endpoints-file="+writePool(t, pdPool))
	c, ctx := dialSynced(t, a)
	answer := func(model string, status int) {
		s, r := route(t, c, ctx, chat(model))
		if r.Immediate != nil {
			t.Fatalf("model %q: %d", model, r.Immediate.Status)
		}
		if _, err := s.Respond(envoy.Response{Status: status, Chunks: [][]byte{[]byte(`{"error":"x"}`)}}); err != nil {
			t.Fatal(err)
		}
		_ = s.CloseSend()
		_, _ = s.Recv()
	}
	for i := range 100 {
		answer(fmt.Sprintf("invented-%d", i), 404) // the engine does not know it
	}
	answer("m", 200)
	values := map[string]bool{}
	waitUntil(t, "both model label values", func() bool {
		values = modelLabels(t, a, "gateway_request_model_fail_total", "tandem_time_to_first_token_seconds")
		return values["m"] && values["other"]
	})
	if len(values) != 2 {
		t.Fatalf("model label values %v, want only the pool's model and \"other\"", values)
	}
}

// modelLabels are the values of the model label across the named families.
func modelLabels(t *testing.T, a *App, families ...string) map[string]bool {
	t.Helper()
	mfs, err := a.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		for _, f := range families {
			if mf.GetName() != f {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "model" {
						out[l.GetValue()] = true
					}
				}
			}
		}
	}
	return out
}

// held describes every tracker count and ledger charge the app holds, "" when none.
func held(a *App) string {
	var out []string
	for _, e := range a.Store().Load().Endpoints {
		k := e.Key()
		for name, n := range map[string]int64{"running": a.Deps().Running.InFlight(k),
			"prefill": a.Cascade().PrefillInFlight(k), "pending_decode": a.Cascade().PendingDecode(k)} {
			if n != 0 {
				out = append(out, name+"["+k+"]="+strconv.FormatInt(n, 10))
			}
		}
	}
	if n := a.TokenLoad().Prefill.Open(); n != 0 {
		out = append(out, "prefill ledger charges="+strconv.Itoa(n))
	}
	if n := a.TokenLoad().Decode.Open(); n != 0 {
		out = append(out, "decode ledger charges="+strconv.Itoa(n))
	}
	return strings.Join(out, ", ")
}

func counter(t *testing.T, a *App, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := a.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				if !hasLabel(m, k, v) {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

// TestLedgersHoldWhileTheDecodeLegRuns: in the epp hand-off with SGLang, the token-load
// charges (the prefill pod's kv tokens, the decode pod's decode tokens) are held for as long as
// the decode leg answers, whatever the prefill leg did, and every tracker and charge is back to
// exactly 0 once the request ended, on every path. An SGLang prefill that answers 200 with an
// unreadable body, or fails after the decode leg responded, used to release them at once
// (issue 11, defect 5). The envoy client plays the gateway and the decode pod; the prefill pod
// is a real HTTP server; everything else is the EPP as cmd/epp wires it.
func TestLedgersHoldWhileTheDecodeLegRuns(t *testing.T) {
	type prefill struct {
		status int
		body   string
		// afterDecode holds the answer until the decode leg's first chunk has gone out.
		afterDecode bool
	}
	cases := []struct {
		name    string
		prefill prefill
		// decode is what the decode leg does: "stream" answers 200 and two chunks; "cancel"
		// goes away mid-stream; "none" never starts (the prefill failure answers the client).
		decode     string
		holdDuring bool // the charges must be held while the decode leg streams
		wantStatus int  // of an ImmediateResponse, when the request fails before the decode leg
	}{
		{"prefill ok", prefill{200, `{"id":"p"}`, false}, "stream", true, 0},
		{"prefill 200, unreadable body", prefill{200, `not json`, false}, "stream", true, 0},
		{"prefill fails after the decode leg responded", prefill{500, `{"error":"x"}`, true}, "stream", true, 0},
		{"prefill fails before the decode leg", prefill{503, `{"error":"x"}`, false}, "none", false, 503},
		{"client goes away mid-stream", prefill{200, `{"id":"p"}`, false}, "cancel", true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			decodeStarted := make(chan struct{})
			answered := make(chan struct{}, 1)
			pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !strings.HasSuffix(r.URL.Path, "completions") {
					http.NotFound(w, r) // metrics scrapes, aborts
					return
				}
				_, _ = io.Copy(io.Discard, r.Body)
				if tc.prefill.afterDecode {
					select {
					case <-decodeStarted:
					case <-r.Context().Done():
						return
					}
				}
				w.WriteHeader(tc.prefill.status)
				_, _ = io.WriteString(w, tc.prefill.body)
				answered <- struct{}{}
			}))
			defer pod.Close()
			// The decode pod's address: the envoy client answers for it; nothing calls it.
			decode := httptest.NewServer(http.NotFoundHandler())
			defer decode.Close()
			host, port, _ := net.SplitHostPort(pod.Listener.Addr().String())
			dhost, dport, _ := net.SplitHostPort(decode.Listener.Addr().String())
			pool := fmt.Sprintf(`
endpoints:
- name: prefill-0
  address: %s
  port: %s
  labels: {role-name: prefill, roleset-name: group-0, model.aibrix.ai/name: m, model.aibrix.ai/engine: sglang}
- name: decode-0
  address: %s
  port: %s
  labels: {role-name: decode, roleset-name: group-0, model.aibrix.ai/name: m, model.aibrix.ai/engine: sglang}
`, host, port, dhost, dport)
			a := startAppEnv(t, map[string]string{"TANDEM_PD_HANDOFF": "epp",
				"AIBRIX_PREFILL_SCORE_POLICY": "token_load", "AIBRIX_DECODE_SCORE_POLICY": "token_load",
				"AIBRIX_DECODE_ABORT_TIMEOUT": "0"}, "--endpoints-file="+writePool(t, pool))
			waitSynced(t, a)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := envoy.Dial(a.ExtProcAddr(), false)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			streamCtx, endStream := context.WithCancel(ctx)
			defer endStream()
			s, err := c.Open(streamCtx)
			if err != nil {
				t.Fatal(err)
			}
			req := envoy.Request{Method: "POST", Path: "/v1/chat/completions",
				Body: []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("a", 4000) + `"}]}`)}
			if err := s.SendRequest(req); err != nil {
				t.Fatal(err)
			}
			if tc.decode == "none" {
				// The prefill failure comes before any response: the client gets it.
				msg, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				// The route (and decode body) may come first: the SGLang legs start together.
				for msg.GetImmediateResponse() == nil && err == nil {
					msg, err = s.Recv()
				}
				if err != nil || int(msg.GetImmediateResponse().GetStatus().GetCode()) != tc.wantStatus {
					t.Fatalf("got %v %v, want a %d", msg, err, tc.wantStatus)
				}
				// AIBrix's status and Tandem's class label (issue 16, item 6): one series per class,
				// under the seed's status="pd_prefill_failure".
				failed := map[string]string{"status": "pd_prefill_failure", "class": "http_status", "status_code": strconv.Itoa(tc.wantStatus)}
				waitUntil(t, "the model failure counted", func() bool { return counter(t, a, "gateway_request_model_fail_total", failed) == 1 })
			} else {
				r, err := s.ReadRoute(req)
				if err != nil || r.Immediate != nil {
					t.Fatalf("route: %v %+v", err, r)
				}
				if gjson.GetBytes(r.Body, "bootstrap_room").Type != gjson.Number {
					t.Fatalf("decode body %s: not an SGLang decode leg", r.Body)
				}
				if !tc.prefill.afterDecode {
					<-answered
				}
				if err := s.SendResponseHeaders(200, nil, false, envoy.Served(r.Endpoints()[0])); err != nil {
					t.Fatal(err)
				}
				if err := s.SendResponseBody([]byte("data: 1\n\n"), false); err != nil {
					t.Fatal(err)
				}
				for range 2 { // the held headers answer, then the chunk
					if _, err := s.Recv(); err != nil {
						t.Fatal(err)
					}
				}
				close(decodeStarted)
				if tc.prefill.afterDecode {
					<-answered
					failed := map[string]string{"stage": "after_response"}
					waitUntil(t, "the prefill failure counted", func() bool { return counter(t, a, "gateway_pd_prefill_failure_total", failed) == 1 })
				} else {
					waitUntil(t, "the prefill success counted", func() bool { return counter(t, a, "gateway_prefill_request_success_total", nil) == 1 })
				}
				if tc.holdDuring {
					if n := a.TokenLoad().Prefill.Open(); n != 1 {
						t.Errorf("prefill ledger: %d charges open while the decode leg streams, want 1 (its kv tokens)", n)
					}
					if n := a.TokenLoad().Decode.Open(); n != 1 {
						t.Errorf("decode ledger: %d charges open while the decode leg streams, want 1", n)
					}
				}
				if tc.decode == "cancel" {
					endStream()
				} else {
					if err := s.SendResponseBody([]byte("data: [DONE]\n\n"), true); err != nil {
						t.Fatal(err)
					}
					if _, err := s.Recv(); err != nil {
						t.Fatal(err)
					}
				}
			}
			_ = s.CloseSend()
			var last string
			if !within(15*time.Second, func() bool { last = held(a); return last == "" }) {
				t.Errorf("after the request ended: %s", last)
			}
		})
	}
}

// checkFlagDocs: every documented flag is in --help with the default the reference shows.
func checkFlagDocs(t *testing.T, docs []config.FlagDoc) {
	t.Helper()
	var out strings.Builder
	if _, err := ParseFlags([]string{"--help"}, &out, func(string) string { return "" }); err != ErrHelp {
		t.Fatalf("err = %v", err)
	}
	fs := NewFlagSet(&Options{}, io.Discard)
	for _, doc := range docs {
		f := fs.Lookup(doc.Name)
		if f == nil || !strings.Contains(out.String(), "-"+doc.Name) {
			t.Errorf("--%s is not a flag listed in --help", doc.Name)
			continue
		}
		if f.DefValue != doc.Default {
			t.Errorf("--%s defaults to %s, the reference says %s", doc.Name, f.DefValue, doc.Default)
		}
	}
}

// TestHelpDocumentsTheLimits: every limit flag is in --help with the default the reference
// (internal/config.LimitFlags) shows, and bad values stop the start with the flag named.
func TestHelpDocumentsTheLimits(t *testing.T) {
	checkFlagDocs(t, config.LimitFlags)
	fs := NewFlagSet(&Options{}, io.Discard)
	if fmt.Sprint(extproc.DefaultMaxBufferedBodyBytes) != fs.Lookup("max-buffered-body-bytes").DefValue {
		t.Error("--max-buffered-body-bytes does not default to extproc's default")
	}
	pool := writePool(t, pdPool)
	for args, want := range map[string]string{
		"--max-streams=0":                  "--max-streams=0",
		"--max-buffered-body-bytes=1024":   "at least --max-body-bytes",
		"--request-body-timeout=-1s":       "--request-body-timeout=-1s",
		"--request-headers-timeout=-1s":    "--request-headers-timeout=-1s",
		"--max-streams-per-connection=0":   "--max-streams-per-connection=0",
		"--grpc-keepalive-time=0s":         "--grpc-keepalive-time=0s",
		"--grpc-max-connection-idle=-1m":   "--grpc-max-connection-idle=-1m0s",
		"--max-buffered-body-bytes=-1":     "--max-buffered-body-bytes=-1",
		"--trust-client-pd-fields=perhaps": "trust-client-pd-fields",
	} {
		_, err := ParseFlags([]string{"--endpoints-file=" + pool, args}, io.Discard, func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to mention %q", args, err, want)
		}
	}
}
