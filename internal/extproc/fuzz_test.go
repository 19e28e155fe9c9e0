package extproc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/app/apptest"
	"github.com/tandem-epp/tandem/internal/extproc"
)

// fuzzEPP is one Tandem wired exactly as cmd/epp wires it (internal/app: production telemetry,
// the real router, PD cascade, ledgers and hand-off), over TLS as gateways reach it.
type fuzzEPP struct {
	app    *app.App
	client *envoy.Client
}

var (
	fuzzOnce sync.Once
	fuzzEPPs []*fuzzEPP
	fuzzErr  error
)

// fuzzPod is a model server for the hand-off's prefill legs: it answers every completion at
// once with a body that satisfies vLLM's and SGLang's adapters, and 404 elsewhere.
func fuzzPod() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "completions") {
			http.NotFound(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"id":"p","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1],"remote_host":"127.0.0.1","remote_port":1}}`)
	}))
}

// fuzzSetup starts the EPPs once per process (the fuzzing engine calls the target many times);
// they live until the process ends. Three wirings: the sidecar hand-off with conformance mode,
// tracing and tight limits; the epp hand-off with SGLang (async prefill legs, aborts, watchdog)
// and the token-load ledgers; the epp hand-off with vLLM (sync prefill legs).
func fuzzSetup(t *testing.T) []*fuzzEPP {
	fuzzOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tandem-fuzz")
		if err != nil {
			fuzzErr = err
			return
		}
		type wiring struct {
			engine string
			env    map[string]string
			args   []string
		}
		for i, w := range []wiring{
			{"vllm", map[string]string{}, []string{"--conformance", "--debug-trace-header", "--max-body-bytes=512",
				"--max-buffered-body-bytes=1024", "--max-streams=4", "--request-body-timeout=1s"}},
			{"sglang", map[string]string{"TANDEM_PD_HANDOFF": "epp", "AIBRIX_PREFILL_SCORE_POLICY": "token_load",
				"AIBRIX_DECODE_SCORE_POLICY": "token_load", "AIBRIX_DECODE_FIRST_RESPONSE_TIMEOUT": "1",
				"AIBRIX_DECODE_STREAM_IDLE_TIMEOUT": "1", "AIBRIX_DECODE_ABORT_TIMEOUT": "1"}, nil},
			{"vllm", map[string]string{"TANDEM_PD_HANDOFF": "epp", "AIBRIX_PREFILL_SCORE_POLICY": "hybrid_cache_load"}, nil},
		} {
			pre, dec, std := fuzzPod(), fuzzPod(), fuzzPod()
			entry := func(name string, s *httptest.Server, role string) string {
				host, port, _ := net.SplitHostPort(s.Listener.Addr().String())
				labels := "model.aibrix.ai/name: m, model.aibrix.ai/engine: " + w.engine
				if role != "" {
					labels += ", role-name: " + role + ", roleset-name: rs-0"
				}
				return fmt.Sprintf("- name: %s\n  address: %s\n  port: %s\n  labels: {%s}\n", name, host, port, labels)
			}
			path := filepath.Join(dir, "pool-"+strconv.Itoa(i)+".yaml")
			pool := "endpoints:\n" + entry("prefill-0", pre, "prefill") + entry("decode-0", dec, "decode") + entry("standard-0", std, "")
			if fuzzErr = os.WriteFile(path, []byte(pool), 0o600); fuzzErr != nil {
				return
			}
			a := apptest.Start(t, apptest.Options{Args: append([]string{"--endpoints-file=" + path}, w.args...),
				Env: w.env, Persist: true})
			c, err := envoy.Dial(a.ExtProcAddr(), true)
			if err != nil {
				fuzzErr = err
				return
			}
			fuzzEPPs = append(fuzzEPPs, &fuzzEPP{app: a, client: c})
		}
	})
	if fuzzErr != nil || len(fuzzEPPs) == 0 {
		t.Fatalf("fuzz EPPs failed to start: %v", fuzzErr)
	}
	return fuzzEPPs
}

// FuzzServer feeds Tandem, wired as cmd/epp wires it, arbitrary message sequences: request and
// response headers (with fuzzed routing-strategy, config-profile, session key and request id
// values), body chunks, trailers, empty messages, half-closes and resets, in any order, against
// the sidecar hand-off and both kinds of epp hand-off. Whatever arrives, the process must not
// die (a panic anywhere on the request path ends the fuzz run), the stream must end, every
// ImmediateResponse is an error status with an OpenAI-style body, and once the stream ended
// every tracker, ledger charge and buffered body byte is released.
func FuzzServer(f *testing.F) {
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	for _, seed := range []struct {
		ops  []byte
		body string
	}{
		{[]byte{0, 0, 1, 0xff, 3, 0, 4, 0, 4, 1}, chat},                            // a whole exchange
		{[]byte{1, 0, 0, 0, 0, 0}, chat},                                           // body first, headers twice
		{[]byte{0, 1, 1, 0xff, 1, 0xff, 1, 0xff, 1, 0xff}, chat},                   // over the body limit
		{[]byte{0, 0x11, 3, 0x01, 5, 0}, ""},                                       // headers-only request
		{[]byte{2, 0, 0, 2, 1, 0x40, 2, 0, 7, 0}, chat},                            // trailers end the request
		{[]byte{0, 5, 1, 0x41, 6, 0, 3, 0x10, 8, 0}, `{"model":"m","prompt":"x"}`}, // epp, then a reset
		{[]byte{0, 5, 1, 0x41, 3, 0x10, 4, 0, 4, 0, 4, 1, 5, 0}, `{"model":"m","prompt":"x"}`},
		{[]byte{9, 0, 1, 0xff, 7, 0}, chat}, // buffered mode, then half-close
		{[]byte{0, 0, 1, 0x20, 7, 0}, `{"model":`},
		// Issue 11: an invalid UTF-8 model (killed the process through the Prometheus client),
		// client-sent PD control fields, and fuzzed strings in every header Tandem reads.
		{[]byte{0, 1, 1, 0xff, 3, 0, 4, 1}, "{\"model\":\"sim\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"},
		{[]byte{0, 0x2, 1, 0xff, 3, 0, 4, 1}, "{\"model\":\"m\",\"prompt\":\"p\",\"kv_transfer_params\":{\"remote_host\":\"10.9.9.9\"}}"},
		{[]byte{0, 0x0d, 1, 0xff, 3, 0, 4, 1}, "\xff{\"model\":\"m\",\"prompt\":\"p\"}"},
	} {
		f.Add(seed.ops, seed.body)
	}
	f.Fuzz(func(t *testing.T, ops []byte, body string) {
		epps := fuzzSetup(t)
		if len(ops) > 64 {
			ops = ops[:64]
		}
		which := 0
		if len(ops) > 1 {
			which = int(ops[1]) % len(epps)
		}
		epp := epps[which]

		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := epp.client.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		answers := make(chan []*extprocv3.ProcessingResponse, 1)
		go func() {
			var got []*extprocv3.ProcessingResponse
			for {
				m, err := s.Recv()
				if err != nil {
					answers <- got
					return
				}
				got = append(got, m)
			}
		}()
		paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/models", ""}
		strategies := []string{"", "random", "least-request", "prefix-cache", "pd", body}
		off := 0
		chunk := func(n int) []byte {
			n = min(n, len(body)-off)
			b := []byte(body[off : off+n])
			off += n
			return b
		}
		reset := false
	send:
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%10, ops[i+1]
			var err error
			switch op {
			case 0, 9:
				hs := envoy.Headers(":method", "POST", "content-type", "application/json", "x-request-id", "r")
				if p := paths[int(arg>>2)%len(paths)]; p != "" {
					hs = append(hs, envoy.Header{Key: ":path", Value: p})
				}
				if st := strategies[int(arg)%len(strategies)]; st != "" {
					hs = append(hs, envoy.Header{Key: "routing-strategy", Value: st})
				}
				if arg&0x20 != 0 { // the fuzzed text in every other header Tandem reads
					hs = append(hs, envoy.Header{Key: "config-profile", Value: body}, envoy.Header{Key: "x-aibrix-session-key", Value: body},
						envoy.Header{Key: "x-request-id", Value: body})
				}
				if arg&0x80 != 0 {
					hs = append(hs, envoy.Header{Key: extproc.HeaderDestination, Value: "10.9.9.9:1"},
						envoy.Header{Key: extproc.HeaderTestSelection, Value: "127.0.0.1"}, envoy.Header{Key: "X-Dup", Value: "a"},
						envoy.Header{Key: "x-dup", Value: "b"}, envoy.Header{Key: extproc.HeaderPrefillerHostPort, Value: "10.9.9.9:2"})
				}
				msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
					RequestHeaders: &extprocv3.HttpHeaders{Headers: envoyHeaderMap(hs), EndOfStream: arg&0x10 != 0}}}
				if arg&0x40 != 0 { // a subset hint: the fuzzed text and one pool address
					if msg.MetadataContext, err = envoy.Subset([]string{strings.ToValidUTF8(body, ""), "127.0.0.1"}); err != nil {
						t.Fatal(err)
					}
				}
				if op == 9 {
					msg.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: procmodev3.ProcessingMode_BUFFERED}
				}
				err = s.Send(msg)
			case 1:
				err = s.SendRequestBody(chunk(int(arg>>1)), arg&1 != 0)
			case 2:
				err = s.SendRequestTrailers(nil)
			case 3:
				err = s.SendResponseHeaders([]int{200, 500, 204, 0}[int(arg>>4)%4], nil, arg&1 != 0, envoy.Served("127.0.0.1:1"))
			case 4:
				err = s.SendResponseBody([]byte("data: x\n\n"), arg&1 != 0)
			case 5:
				err = s.SendResponseTrailers(nil)
			case 6:
				err = s.Send(&extprocv3.ProcessingRequest{})
			case 7:
				break send
			case 8:
				reset = true
				break send
			}
			if err != nil {
				break // the server ended the stream
			}
		}
		if reset {
			cancel()
		} else {
			// A half-close ends any stream: the server answers what it owes and stops.
			_ = s.CloseSend()
		}
		var got []*extprocv3.ProcessingResponse
		select {
		case got = <-answers:
		case <-time.After(10 * time.Second):
			t.Fatal("the stream did not end within 10s of the client half-closing it")
		}
		cancel()
		t.Logf("EPP %d: %d answers", which, len(got))
		for _, m := range got {
			ir := m.GetImmediateResponse()
			if ir == nil {
				continue
			}
			var doc struct {
				Error struct{ Message, Type string } `json:"error"`
			}
			if code := int(ir.GetStatus().GetCode()); code < 400 || code > 599 {
				t.Fatalf("ImmediateResponse status %d", code)
			}
			if err := json.Unmarshal(ir.GetBody(), &doc); err != nil || doc.Error.Message == "" || doc.Error.Type == "" {
				t.Fatalf("ImmediateResponse body %s: %v", ir.GetBody(), err)
			}
		}
		// The server finishes the stream a moment after the client saw its end.
		deadline := time.Now().Add(10 * time.Second)
		for {
			left := leftovers(t, epp.app)
			if left == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("10s after the stream ended, still held: %s", left)
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// leftovers describes what the EPP still holds for finished streams, "" when nothing: open
// streams, buffered body bytes, tracker counts and ledger charges.
func leftovers(t *testing.T, a *app.App) string {
	t.Helper()
	var out []string
	mfs, err := a.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "tandem_extproc_streams_open", "tandem_extproc_buffered_body_bytes":
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 0 {
				out = append(out, fmt.Sprintf("%s=%v", mf.GetName(), v))
			}
		}
	}
	for _, e := range a.Store().Load().Endpoints {
		k := e.Key()
		for name, n := range map[string]int64{"running": a.Deps().Running.InFlight(k),
			"prefill": a.Cascade().PrefillInFlight(k), "pending_decode": a.Cascade().PendingDecode(k)} {
			if n != 0 {
				out = append(out, fmt.Sprintf("%s[%s]=%d", name, k, n))
			}
		}
	}
	if n := a.TokenLoad().Prefill.Open(); n != 0 {
		out = append(out, fmt.Sprintf("prefill ledger charges=%d", n))
	}
	if n := a.TokenLoad().Decode.Open(); n != 0 {
		out = append(out, fmt.Sprintf("decode ledger charges=%d", n))
	}
	return strings.Join(out, ", ")
}

// envoyHeaderMap builds a header map as Envoy sends it (raw_value).
func envoyHeaderMap(hs []envoy.Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, h := range hs {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: h.Key, RawValue: []byte(h.Value)})
	}
	return m
}
