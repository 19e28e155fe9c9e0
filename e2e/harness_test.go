package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/app/apptest"
	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/gateway"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/sim"
	"github.com/tandem-epp/tandem/internal/tokenize"
)

const (
	modelName = "m"
	// simTimeScale runs the simulated GPUs 50× faster than the latency model.
	simTimeScale = 0.02
	// subsetHeader carries a subset hint (ip:port list) from a test client through the gateway
	// to Tandem as envoy.lb.subset_hint metadata.
	subsetHeader = "X-E2e-Subset"
	// prefillerHeader is the sidecar hand-off header Tandem sets on the decode request.
	prefillerHeader = "X-Prefiller-Host-Port"
	// waitLimit bounds every wait for a condition (reload seen, metric scraped, health SERVING).
	waitLimit = 20 * time.Second
)

// pdConfig is the model.aibrix.ai/config annotation naming the pd strategy, with an optional
// routingConfig object (JSON) such as `{"combined":true}`.
func pdConfig(routing string) string {
	if routing == "" {
		return `{"profiles":{"default":{"routingStrategy":"pd"}}}`
	}
	return `{"profiles":{"default":{"routingStrategy":"pd","routingConfig":` + routing + `}}}`
}

// podSpec is one simulated vLLM pod and how the pool shows it.
type podSpec struct {
	name    string
	role    string // sim.RolePrefill, sim.RoleDecode or sim.RoleStandard
	roleset string
	sidecar bool   // decode pods: run the prefill leg themselves (llm-d routing sidecar)
	config  string // model.aibrix.ai/config annotation; "" means pdConfig("")
	params  *sim.Params
}

// pod is a running simulated pod.
type pod struct {
	podSpec
	*sim.Server
}

func (p *pod) port() int32 {
	_, port, _ := net.SplitHostPort(p.HostPort())
	n, _ := strconv.Atoi(port)
	return int32(n)
}

// labels are the pod labels Tandem classifies it by (the seed's names).
func (p *pod) labels() map[string]string {
	l := map[string]string{pool.LabelModelName: modelName, "model.aibrix.ai/engine": "vllm"}
	if p.role != sim.RoleStandard {
		l["role-name"] = p.role
		l["roleset-name"] = p.roleset
	}
	if p.sidecar {
		// llm-d's role label: how a decode pod with llm-d's routing sidecar shows itself, so
		// the default (auto) hand-off names the prefill pod for it instead of running the leg.
		l[pool.LabelLLMDRole] = p.role
	}
	return l
}

func (p *pod) annotations() map[string]string {
	c := p.config
	if c == "" {
		c = pdConfig("")
	}
	return map[string]string{"model.aibrix.ai/config": c}
}

// startPods starts one simulator per spec on 127.0.0.1; they close when the test ends.
func startPods(t *testing.T, specs ...podSpec) map[string]*pod {
	t.Helper()
	pods := map[string]*pod{}
	for _, sp := range specs {
		cfg := sim.PodConfig{Name: sp.name, Engine: sim.EngineVLLM, Role: sp.role, Model: modelName,
			TimeScale: simTimeScale, RoutingSidecar: sp.sidecar}
		if sp.params != nil {
			cfg.Params = *sp.params
		}
		pods[sp.name] = &pod{podSpec: sp, Server: sim.StartForTest(t, cfg)}
	}
	return pods
}

// pdPods is the usual layout: rolesets rs-a and rs-b, each one prefill and one decode pod
// (decode pods in sidecar mode), named prefill-a, decode-a, prefill-b, decode-b.
func pdPods(rolesets ...string) []podSpec {
	var out []podSpec
	for _, rs := range rolesets {
		out = append(out,
			podSpec{name: "prefill-" + rs, role: sim.RolePrefill, roleset: "rs-" + rs},
			podSpec{name: "decode-" + rs, role: sim.RoleDecode, roleset: "rs-" + rs, sidecar: true})
	}
	return out
}

// writePoolFile replaces the endpoints file with the given pods, atomically (write + rename),
// as a ConfigMap update or a careful editor would.
func writePoolFile(t *testing.T, path string, pods ...*pod) {
	t.Helper()
	f := demo.EndpointsFile{Pool: map[string]string{"name": "e2e", "namespace": "default"}}
	for _, p := range pods {
		f.Endpoints = append(f.Endpoints, demo.SimEndpoint(p.name, p.Server, p.labels(), p.annotations()))
	}
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
}

// startTandem runs Tandem in-process (internal/app, as cmd/epp does) on free loopback ports,
// with env as its whole environment, until the test ends; it returns once health is SERVING.
func startTandem(t *testing.T, args []string, env map[string]string, rc *rest.Config) *app.App {
	t.Helper()
	return apptest.Start(t, apptest.Options{Args: args, Env: env, RestConfig: rc, Limit: waitLimit})
}

// startGateway serves the local gateway on a free loopback port in front of the EPP at
// eppAddr (TLS, as Envoy talks to an EPP) until the test ends, and returns its base URL.
func startGateway(t *testing.T, eppAddr string) string {
	t.Helper()
	return serveGateway(t, gateway.Options{EPPAddr: eppAddr, TLS: true,
		SubsetHint: gateway.SubsetFromHeader(subsetHeader), DecisionTimeout: 10 * time.Second})
}

// serveGateway serves the local gateway with opts on a free loopback port until the test ends.
func serveGateway(t *testing.T, opts gateway.Options) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- gateway.Serve(ctx, ln, opts)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("gateway: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("gateway did not stop within 10s")
		}
	})
	return "http://" + ln.Addr().String()
}

// stack is pods + Tandem (file pool) + gateway, all on loopback.
type stack struct {
	t        *testing.T
	pods     map[string]*pod
	poolFile string
	tandem   *app.App
	gwURL    string
	client   *http.Client
	seq      atomic.Int64
}

// defaultEnv is the Tandem environment of every test: scrape the pods every 200 ms.
func defaultEnv(extra map[string]string) map[string]string {
	env := map[string]string{"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "200"}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// newFileStack starts the pods, writes every one of them to the endpoints file, and starts
// Tandem on that file and the gateway in front of it.
func newFileStack(t *testing.T, env map[string]string, specs ...podSpec) *stack {
	t.Helper()
	s := &stack{t: t, pods: startPods(t, specs...), poolFile: filepath.Join(t.TempDir(), "endpoints.yaml")}
	var all []*pod
	for _, sp := range specs {
		all = append(all, s.pods[sp.name])
	}
	writePoolFile(t, s.poolFile, all...)
	s.tandem = startTandem(t, []string{"--endpoints-file=" + s.poolFile}, defaultEnv(env), nil)
	s.gwURL = startGateway(t, s.tandem.ExtProcAddr())
	s.client = newClient()
	return s
}

func newClient() *http.Client {
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
}

// setPool rewrites the endpoints file to hold exactly the named pods and waits until
// Tandem's pool snapshot has exactly their endpoints.
func (s *stack) setPool(names ...string) {
	s.t.Helper()
	var ps []*pod
	want := map[string]bool{}
	for _, n := range names {
		ps = append(ps, s.pods[n])
		want[n] = true
	}
	writePoolFile(s.t, s.poolFile, ps...)
	eventually(s.t, "Tandem's pool to reload to "+strings.Join(names, ","), func() (bool, string) {
		snap := s.tandem.Store().Load()
		got := map[string]bool{}
		for _, e := range snap.Endpoints {
			got[e.Name] = true
		}
		if len(got) != len(want) {
			return false, fmt.Sprintf("pool has %v", got)
		}
		for n := range want {
			if !got[n] {
				return false, fmt.Sprintf("pool has %v", got)
			}
		}
		return true, ""
	})
}

// eventually polls cond (every 10 ms) until it holds, failing the test after waitLimit with
// cond's last explanation. It waits for a condition with a deadline; it never stands in for one.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: %s", waitLimit, what, why)
		}
		time.Sleep(10 * time.Millisecond) // poll interval of a bounded wait
	}
}

// marker returns a fresh request marker; it is the start of the prompt, so each pod's
// recorded bodies can be matched to the client request.
func (s *stack) marker(prefix string) string {
	return fmt.Sprintf("%s-%04d", prefix, s.seq.Add(1))
}

// prompt is marker followed by filler, about tokens tokens long (4 bytes a token).
func prompt(marker string, tokens int) string {
	p := marker + " "
	for len(p) < tokens*4 {
		p += "lorem ipsum dolor sit amet "
	}
	return p[:max(tokens*4, len(marker)+1)]
}

// promptOfTokens is a prompt starting with marker of exactly tokens cl100k_base tokens (at least
// the marker's), the count bucketing compares with the pods' ranges.
func promptOfTokens(t *testing.T, marker string, tokens int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(marker)
	n, _, err := tokenize.Count(marker, 0)
	if err != nil {
		t.Fatal(err)
	}
	words := []string{" lorem", " ipsum", " dolor", " sit", " amet"} // one token each after a word
	for i := 0; n < tokens; i++ {
		b.WriteString(words[i%len(words)])
		n++
	}
	p := b.String()
	if got, _, _ := tokenize.Count(p, 0); got != max(tokens, n) {
		t.Fatalf("prompt of %d tokens counts %d", tokens, got)
	}
	return p
}

// hasMarker reports whether body carries the prompt that starts with marker.
func hasMarker(body []byte, marker string) bool { return bytes.Contains(body, []byte(marker+" ")) }

// chatBody is a chat completion request asking for maxTokens tokens.
func chatBody(prompt string, maxTokens int, stream bool) []byte {
	return chatBodyFor(modelName, prompt, maxTokens, stream)
}

func chatBodyFor(model, prompt string, maxTokens int, stream bool) []byte {
	m := map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": maxTokens}
	if stream {
		m["stream"] = true
		m["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return b
}

// completionBody is a legacy completion request.
func completionBody(prompt string, maxTokens int, stream bool) []byte {
	return completionBodyFor(modelName, prompt, maxTokens, stream)
}

func completionBodyFor(model, prompt string, maxTokens int, stream bool) []byte {
	m := map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "stream": stream}
	b, _ := json.Marshal(m)
	return b
}

// reply is what a client got from the gateway.
type reply struct {
	status int
	header http.Header
	body   []byte
	pod    string // X-Sim-Pod: the simulated pod that answered
	err    error
}

func (r reply) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	return fmt.Sprintf("%d from %q: %.300s", r.status, r.pod, r.body)
}

// post sends one request through the gateway and reads the whole answer.
func (s *stack) post(ctx context.Context, path string, body []byte, hdr map[string]string) reply {
	return post(ctx, s.client, s.gwURL, path, body, hdr)
}

func post(ctx context.Context, c *http.Client, base, path string, body []byte, hdr map[string]string) reply {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, pod: resp.Header.Get("X-Sim-Pod"), err: err}
}

// okCompletion checks a 200 answer is a whole completion: a JSON object with choices, or an
// SSE stream ending in [DONE].
func okCompletion(r reply, stream bool) error {
	if r.err != nil || r.status != http.StatusOK {
		return fmt.Errorf("want 200, got %v", r)
	}
	if stream {
		if !bytes.HasSuffix(bytes.TrimSpace(r.body), []byte("data: [DONE]")) {
			return fmt.Errorf("stream does not end with [DONE]: %.300s", r.body)
		}
		return nil
	}
	var v struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if err := json.Unmarshal(r.body, &v); err != nil || len(v.Choices) != 1 {
		return fmt.Errorf("not a completion object (%v): %.300s", err, r.body)
	}
	return nil
}

// received lists what p recorded for the request with marker: requests that came in over
// the network (from the gateway, or a sidecar's prefill leg), without the decode bodies a
// sidecar-mode pod records for itself.
func received(p *pod, marker string) []sim.Recorded {
	var out []sim.Recorded
	for _, r := range p.Requests() {
		if hasMarker(r.Body, marker) && r.Header.Get(sim.HeaderSidecarLeg) == "" {
			out = append(out, r)
		}
	}
	return out
}

// countReceived is how many requests p recorded from the network (sidecar self-records excluded).
func countReceived(p *pod) int {
	n := 0
	for _, r := range p.Requests() {
		if r.Header.Get(sim.HeaderSidecarLeg) == "" {
			n++
		}
	}
	return n
}

// waitReceived waits until p has recorded the request with marker and returns it.
func waitReceived(t *testing.T, p *pod, marker string) sim.Recorded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := p.WaitRequest(ctx, func(r sim.Recorded) bool {
		return hasMarker(r.Body, marker) && r.Header.Get(sim.HeaderSidecarLeg) == ""
	})
	if err != nil {
		t.Fatalf("pod %s never received request %s: %v", p.name, marker, err)
	}
	return r
}

// tandemMetrics scrapes Tandem's own /metrics.
func tandemMetrics(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// metricValue returns the value of the sample of family name whose labels include want.
func metricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// waitMetric waits until Tandem's metric (family name, labels want) satisfies ok.
func waitMetric(t *testing.T, addr, name string, want map[string]string, ok func(float64) bool, what string) float64 {
	t.Helper()
	var v float64
	eventually(t, what, func() (bool, string) {
		fams, err := tandemMetrics(addr)
		if err != nil {
			return false, err.Error()
		}
		var found bool
		v, found = metricValue(fams, name, want)
		if !found {
			return false, fmt.Sprintf("%s%v not exported", name, want)
		}
		return ok(v), fmt.Sprintf("%s%v = %v", name, want, v)
	})
	return v
}

// errorBody is the OpenAI-style error object Tandem answers with.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func parseErrorBody(b []byte) (errorBody, error) {
	var e errorBody
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return e, fmt.Errorf("not an OpenAI error object: %w: %s", err, b)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		return e, errors.New("error object without message or type: " + string(b))
	}
	return e, nil
}

// testCtx is a context for one test's traffic, bounded so a hang fails instead of blocking.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitScrapes waits until Tandem has finished n more scrapes of vLLM pods than when called,
// so every sample it holds was taken after this point (n ≥ 2 × the pods scraped).
func waitScrapes(t *testing.T, addr string, n int) {
	t.Helper()
	labels := map[string]string{"engine": "vllm"}
	fams, err := tandemMetrics(addr)
	if err != nil {
		t.Fatal(err)
	}
	start, _ := metricValue(fams, "tandem_scrape_duration_seconds", labels)
	waitMetric(t, addr, "tandem_scrape_duration_seconds", labels, func(v float64) bool { return v >= start+float64(n) },
		fmt.Sprintf("%d more scrapes of the pods", n))
}
