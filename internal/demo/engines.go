package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/gateway"
	"github.com/tandem-epp/tandem/internal/sim"
)

// The engine check: after the replay, one prefill/decode pair per engine (vLLM, SGLang,
// TensorRT-LLM), each behind its own Tandem and gateway with the "epp" hand-off (Tandem runs
// the prefill leg; no decode-side sidecar), answers a few requests. A pool serves one model on
// one engine, hence one small stack per engine.

// EngineResult is one engine's part of the check.
type EngineResult struct {
	Engine      string
	Requests    int
	OK          int // 200 with tokens, answered by the decode pod
	PD          int // ... whose KV came from the prefill pod (X-Sim-Transfer-Seconds > 0)
	PrefillLegs int // legs the prefill pod received (Tandem sent them)
	Errors      []string
}

// engineRequests are the check's requests: chat and completions, streamed and whole, a
// completions prompt of token ids, chat with content parts, and (vLLM only: SGLang and
// TensorRT-LLM do not carry the hand-off on them, see docs/apis.md) one Anthropic Messages and
// one OpenAI Responses request.
var engineRequests = []struct {
	path     string
	body     string
	vllmOnly bool
}{
	{"/v1/chat/completions", `{"model":"` + Model + `","messages":[{"role":"user","content":"Name a sea with many ships on it."}],"max_tokens":6}`, false},
	{"/v1/chat/completions", `{"model":"` + Model + `","messages":[{"role":"user","content":"Name a sea with many ships on it."}],"max_tokens":6,"stream":true}`, false},
	{"/v1/completions", `{"model":"` + Model + `","prompt":"The ships on the sea","max_tokens":6}`, false},
	{"/v1/completions", `{"model":"` + Model + `","prompt":"The ships on the sea","max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}`, false},
	{"/v1/completions", `{"model":"` + Model + `","prompt":[791,18198,389,279,9581],"max_tokens":6}`, false},
	{"/v1/chat/completions", `{"model":"` + Model + `","messages":[{"role":"user","content":[{"type":"text","text":"Name a sea"},{"type":"text","text":" with many ships."}]}],"max_tokens":6}`, false},
	{"/v1/messages", `{"model":"` + Model + `","system":"Be brief.","messages":[{"role":"user","content":"Name a sea with many ships on it."}],"max_tokens":6,"stream":true}`, true},
	{"/v1/responses", `{"model":"` + Model + `","input":"Name a sea with many ships on it.","max_output_tokens":6}`, true},
}

// CheckEngines runs the engine check with run starting each Tandem.
func CheckEngines(ctx context.Context, run EPPRunner, timeScale float64, log logr.Logger) []EngineResult {
	var out []EngineResult
	for _, engine := range []string{sim.EngineVLLM, sim.EngineSGLang, sim.EngineTRTLLM} {
		r := EngineResult{Engine: engine}
		if err := checkEngine(ctx, run, timeScale, log, &r); err != nil {
			r.Errors = append(r.Errors, err.Error())
		}
		out = append(out, r)
		if ctx.Err() != nil {
			break
		}
	}
	return out
}

func checkEngine(ctx context.Context, run EPPRunner, timeScale float64, log logr.Logger, r *EngineResult) (err error) {
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	pods := map[string]*sim.Server{}
	for _, role := range []string{sim.RolePrefill, sim.RoleDecode} {
		s, err := sim.Start(ctx, sim.PodConfig{Name: r.Engine + "-" + role, Engine: r.Engine, Role: role, Model: Model, TimeScale: timeScale})
		if err != nil {
			return fmt.Errorf("starting the %s pod: %w", role, err)
		}
		stops = append(stops, s.Close)
		pods[role] = s
	}
	dir, err := os.MkdirTemp("", "tandem-demo-"+r.Engine+"-")
	if err != nil {
		return err
	}
	stops = append(stops, func() { os.RemoveAll(dir) })
	endpoints := filepath.Join(dir, "endpoints.yaml")
	if err := writeEngineEndpoints(endpoints, r.Engine, pods); err != nil {
		return err
	}
	ports, err := FreePorts(3)
	if err != nil {
		return err
	}
	args := []string{"--endpoints-file", endpoints, "--bind-address", "127.0.0.1",
		"--grpc-port", strconv.Itoa(ports[0]), "--grpc-health-port", strconv.Itoa(ports[1]),
		"--metrics-port", strconv.Itoa(ports[2]), "--zap-log-level", "error"}
	eppCtx, stopEPP := context.WithCancel(context.Background())
	eppDone := make(chan error, 1)
	go func() { eppDone <- run(eppCtx, args) }()
	stops = append(stops, func() {
		stopEPP()
		select {
		case <-eppDone:
		case <-time.After(15 * time.Second):
			log.Info("Tandem did not stop within 15s; leaving it", "engine", r.Engine)
		}
	})
	if err := WaitServing(ctx, fmt.Sprintf("127.0.0.1:%d", ports[1]), eppDone, 30*time.Second); err != nil {
		return fmt.Errorf("starting Tandem: %w", err)
	}
	gw, err := gateway.New(gateway.Options{EPPAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), TLS: true, Logger: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		gw.Close()
		return err
	}
	hs := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	stops = append(stops, func() { _ = hs.Close(); _ = gw.Close() })

	client := &http.Client{Timeout: 60 * time.Second}
	defer client.CloseIdleConnections()
	url := "http://" + ln.Addr().String()
	for _, q := range engineRequests {
		if q.vllmOnly && r.Engine != sim.EngineVLLM {
			continue
		}
		r.Requests++
		if err := engineRequest(ctx, client, url, q.path, q.body, pods[sim.RoleDecode].Config().Name, r); err != nil {
			r.Errors = append(r.Errors, err.Error())
		}
	}
	for _, rec := range pods[sim.RolePrefill].Requests() {
		if strings.HasSuffix(rec.Path, "completions") || strings.HasSuffix(rec.Path, "/messages") || strings.HasSuffix(rec.Path, "/responses") {
			r.PrefillLegs++
		}
	}
	return nil
}

func engineRequest(ctx context.Context, client *http.Client, url, path, body, decodePod string, r *EngineResult) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader([]byte(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return fmt.Errorf("%s: reading the answer: %w", path, err)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%s: HTTP %d: %s", path, resp.StatusCode, bytes.TrimSpace(b))
	case resp.Header.Get("X-Sim-Pod") != decodePod:
		return fmt.Errorf("%s: answered by %q, not the decode pod", path, resp.Header.Get("X-Sim-Pod"))
	case !bytes.Contains(b, []byte(`"content":"`)) && !bytes.Contains(b, []byte(`"text":"`)):
		return fmt.Errorf("%s: no tokens in %.80q", path, b)
	}
	r.OK++
	if v, err := strconv.ParseFloat(resp.Header.Get("X-Sim-Transfer-Seconds"), 64); err == nil && v > 0 {
		r.PD++
	}
	return nil
}

// writeEngineEndpoints writes the pair's pool: the pd strategy with the epp hand-off in the
// default profile, and SGLang's bootstrap port annotation on its prefill pod.
func writeEngineEndpoints(path, engine string, pods map[string]*sim.Server) error {
	cfg := `{"profiles":{"default":{"routingStrategy":"pd","routingConfig":{"handoff":"epp"}}}}`
	f := EndpointsFile{Pool: map[string]string{"name": "demo-" + engine, "namespace": "default"}}
	for _, role := range []string{sim.RolePrefill, sim.RoleDecode} {
		s := pods[role]
		ann := map[string]string{"model.aibrix.ai/config": cfg}
		if engine == sim.EngineSGLang && role == sim.RolePrefill {
			ann["model.aibrix.ai/sglang-bootstrap-port"] = strconv.Itoa(s.BootstrapPort())
		}
		f.Endpoints = append(f.Endpoints, SimEndpoint(engine+"-"+role, s,
			map[string]string{"model.aibrix.ai/name": Model, "model.aibrix.ai/engine": engine,
				"role-name": role, "roleset-name": "rs-" + engine}, ann))
	}
	return f.Write(path)
}

// ReportEngines prints the engine check; it returns an error when any engine failed.
func ReportEngines(w io.Writer, results []EngineResult) error {
	fmt.Fprintln(w, "\nPrefill/decode hand-off run by Tandem itself (epp mode, no sidecar), one pair per engine:")
	var errs []error
	for _, r := range results {
		status := "ok"
		if len(r.Errors) > 0 || r.OK != r.Requests || r.PD != r.Requests || r.PrefillLegs != r.Requests {
			status = "FAILED"
			errs = append(errs, fmt.Errorf("%s: %d/%d answered, %d with KV from the prefill pod, %d prefill legs: %s",
				r.Engine, r.OK, r.Requests, r.PD, r.PrefillLegs, strings.Join(r.Errors, "; ")))
		}
		fmt.Fprintf(w, "  %-8s %d/%d answered by the decode pod, %d with KV from the prefill pod, %d prefill legs sent by Tandem  %s\n",
			r.Engine, r.OK, r.Requests, r.PD, r.PrefillLegs, status)
		for _, e := range r.Errors {
			fmt.Fprintf(w, "           %s\n", e)
		}
	}
	return errors.Join(errs...)
}
