package handoffe2e

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/app/apptest"
	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/gateway"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/sim"
)

const (
	modelName = "m"
	// simTimeScale runs the simulated GPUs 1000× faster than the latency model.
	simTimeScale = 0.001
	// waitLimit bounds every wait in these tests.
	waitLimit = 20 * time.Second
)

// stackOptions describe one PD pair of an engine behind Tandem and the gateway.
type stackOptions struct {
	engine string // sim.EngineVLLM, sim.EngineSGLang or sim.EngineTRTLLM
	// env is Tandem's whole environment (TANDEM_PD_HANDOFF, AIBRIX_* knobs).
	env map[string]string
	// sidecar makes the decode pod act on x-prefiller-host-port (llm-d routing sidecar, vLLM).
	sidecar bool
	// prefillLabels are added to the prefill pod's labels (e.g. the kv connector).
	prefillLabels map[string]string
	// routing, when set, is the default profile's routingConfig (JSON) in both pods'
	// model.aibrix.ai/config annotation: per-profile hand-off mode and PD overrides.
	routing string
}

// stack is a running prefill pod, decode pod, Tandem and gateway.
type stack struct {
	t               *testing.T
	prefill, decode *sim.Server
	app             *app.App
	url             string // the gateway
}

func startPod(t *testing.T, engine, role string, sidecar bool) *sim.Server {
	t.Helper()
	p := sim.DefaultParams()
	p.KVHold, p.BootstrapTimeout = 10000, 10000 // 10 s of wall time at simTimeScale
	return sim.StartForTest(t, sim.PodConfig{Name: engine + "-" + role, Engine: engine, Role: role,
		Model: modelName, Params: p, TimeScale: simTimeScale, RoutingSidecar: sidecar})
}

// entry is a pod of the pair in the endpoints file: the model, engine and role labels (roleset
// rs-0) plus extra, and the annotations ann.
func entry(name string, s *sim.Server, engine, role string, extra, ann map[string]string) demo.FileEndpoint {
	l := map[string]string{pool.LabelModelName: modelName, pool.LabelEngine: engine,
		"role-name": role, "roleset-name": "rs-0"}
	for k, v := range extra {
		l[k] = v
	}
	return demo.SimEndpoint(name, s, l, ann)
}

func writePool(t *testing.T, entries ...demo.FileEndpoint) string {
	t.Helper()
	f := demo.EndpointsFile{Pool: map[string]string{"name": "handoff", "namespace": "default"}, Endpoints: entries}
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// newStack starts the pods, Tandem on their endpoints file and the gateway; all stop when the
// test ends, after checking that every tracker and ledger went back to zero.
func newStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	st := &stack{t: t, prefill: startPod(t, o.engine, sim.RolePrefill, false),
		decode: startPod(t, o.engine, sim.RoleDecode, o.sidecar)}
	ann, decAnn := map[string]string{}, map[string]string{}
	if o.engine == sim.EngineSGLang {
		ann[pool.AnnotationSGLangBootstrapPort] = strconv.Itoa(st.prefill.BootstrapPort())
	}
	if o.routing != "" {
		cfg := `{"profiles":{"default":{"routingStrategy":"pd","routingConfig":` + o.routing + `}}}`
		ann["model.aibrix.ai/config"], decAnn["model.aibrix.ai/config"] = cfg, cfg
	}
	path := writePool(t,
		entry("prefill-0", st.prefill, o.engine, "prefill", o.prefillLabels, ann),
		entry("decode-0", st.decode, o.engine, "decode", nil, decAnn))
	st.app = startTandem(t, []string{"--endpoints-file=" + path}, o.env)
	st.url = startGateway(t, st.app.ExtProcAddr())
	t.Cleanup(st.checkReleased)
	return st
}

// startTandem runs Tandem in-process (internal/app, as cmd/epp does) on free loopback ports,
// with env as its whole environment, until the test ends; it returns once health is SERVING.
func startTandem(t *testing.T, args []string, env map[string]string) *app.App {
	t.Helper()
	return apptest.Start(t, apptest.Options{Args: args, Env: env, RestConfig: nil, Limit: waitLimit})
}

func startGateway(t *testing.T, eppAddr string) string {
	t.Helper()
	g, err := gateway.New(gateway.Options{EPPAddr: eppAddr, TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		_ = hs.Close()
		_ = g.Close()
	})
	return "http://" + ln.Addr().String()
}

// reply is what the client got through the gateway.
type reply struct {
	status  int
	header  http.Header
	body    []byte
	readErr error // non-nil when the response was cut short
}

// post sends body to the gateway; header adds request headers.
func (st *stack) post(ctx context.Context, path string, body []byte, header map[string]string) reply {
	st.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.url+path, bytes.NewReader(body))
	if err != nil {
		st.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{readErr: err}
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, readErr: rerr}
}

// text is the generated text of a streamed or whole answer.
func (r reply) text() string { return sim.AnswerText(r.body) }

// inferences are the inference requests (completions, chat, Messages, Responses) a pod received, oldest first (sidecar-built bodies
// carry sim.HeaderSidecarLeg).
func inferences(s *sim.Server) []sim.Recorded {
	var out []sim.Recorded
	for _, r := range s.Requests() {
		if r.Method == http.MethodPost && (strings.HasSuffix(r.Path, "completions") || strings.HasSuffix(r.Path, "/messages") || strings.HasSuffix(r.Path, "/responses")) {
			out = append(out, r)
		}
	}
	return out
}

// checkReleased fails the test unless every tracker and ledger charge Tandem took for its
// requests was released. The ext_proc stream (and with it the request's lifecycle) ends a
// moment after the client has its answer, so this waits, bounded, for the counts to settle.
func (st *stack) checkReleased() {
	t := st.t
	var last string
	ok := eventually(func() bool {
		last = st.held()
		return last == ""
	})
	if !ok {
		t.Errorf("trackers or ledgers not released: %s", last)
	}
}

// held describes what is still charged, "" when nothing.
func (st *stack) held() string {
	var out []string
	c := st.app.Cascade()
	for _, e := range st.app.Store().Load().Endpoints {
		k := e.Key()
		for name, n := range map[string]int64{"running": st.app.Deps().Running.InFlight(k),
			"prefill": c.PrefillInFlight(k), "pending_decode": c.PendingDecode(k)} {
			if n != 0 {
				out = append(out, name+"["+k+"]="+strconv.FormatInt(n, 10))
			}
		}
	}
	tl := st.app.TokenLoad()
	if n := tl.Prefill.Open(); n != 0 {
		out = append(out, "prefill ledger charges="+strconv.Itoa(n))
	}
	if n := tl.Decode.Open(); n != 0 {
		out = append(out, "decode ledger charges="+strconv.Itoa(n))
	}
	return strings.Join(out, ", ")
}

// eventually reports whether cond holds within waitLimit, checking it every millisecond.
// Used only where no event marks the moment (Tandem's per-stream cleanup after the reply).
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// counter is the value of a Tandem counter with the given labels (0 when absent).
func (st *stack) counter(name string, labels map[string]string) float64 {
	st.t.Helper()
	mfs, err := st.app.Gatherer().Gather()
	if err != nil {
		st.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// series is how many label sets a Tandem metric has.
func (st *stack) series(name string) int {
	st.t.Helper()
	mfs, err := st.app.Gatherer().Gather()
	if err != nil {
		st.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

func matches(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// abortRIDs are the rids of the /abort_request calls a pod received, in order.
func abortRIDs(s *sim.Server) []string {
	var out []string
	for _, r := range s.Requests() {
		if r.Path == "/abort_request" {
			out = append(out, gjson.GetBytes(r.Body, "rid").Str)
		}
	}
	return out
}

// waitAborts waits until the pod received n /abort_request calls.
func waitAborts(ctx context.Context, s *sim.Server, n int) ([]string, error) {
	_, err := s.WaitRequest(ctx, func(sim.Recorded) bool { return len(abortRIDs(s)) >= n })
	return abortRIDs(s), err
}
