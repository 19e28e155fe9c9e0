package app

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger/redistest"
)

const pdPool = `
endpoints:
- name: prefill-0
  address: 127.0.0.1
  port: 18100
  labels: {role-name: prefill, roleset-name: group-0, model.aibrix.ai/name: m}
- name: decode-0
  address: 127.0.0.1
  port: 18200
  # llm-d's role label declares the routing sidecar: the auto hand-off names the prefill pod.
  labels: {role-name: decode, roleset-name: group-0, model.aibrix.ai/name: m, llm-d.ai/role: decode}
`

// startApp runs the whole EPP from a command line, with free ports, until the test ends.
func startApp(t *testing.T, args ...string) *App {
	t.Helper()
	return startAppEnv(t, nil, args...)
}

func startAppEnv(t *testing.T, env map[string]string, args ...string) *App {
	t.Helper()
	return startAppEnvWith(t, env, nil, args...)
}

// startAppWith is startApp with the parsed options adjusted by mut before New.
func startAppWith(t *testing.T, mut func(*Options), args ...string) *App {
	t.Helper()
	return startAppEnvWith(t, nil, mut, args...)
}

func startAppEnvWith(t *testing.T, env map[string]string, mut func(*Options), args ...string) *App {
	t.Helper()
	getenv := func(k string) string { return env[k] }
	opts, err := ParseFlags(append([]string{"--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0",
		"--bind-address=127.0.0.1", "--secure-serving=false"}, args...), io.Discard, getenv)
	if err != nil {
		t.Fatal(err)
	}
	opts.metricsAnyPort = true
	if mut != nil {
		mut(opts)
	}
	a, err := New(context.Background(), opts, Env{Getenv: getenv})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return a
}

func writePool(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunServesHealthRoutesAndMetrics(t *testing.T) {
	a := startApp(t, "--endpoints-file="+writePool(t, pdPool))

	// Health turns SERVING once the file pool is published.
	hc, err := grpc.NewClient(a.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(hc).Watch(ctx, &healthpb.HealthCheckRequest{Service: "inference-extension"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("health watch: %v", err)
		}
		if r.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}

	// A chat request is routed PD: decode pod as destination, prefill target in the header.
	c, err := envoy.Dial(a.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := envoy.Request{Method: "POST", Path: "/v1/chat/completions",
		Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)}
	if err := s.SendRequest(req); err != nil {
		t.Fatal(err)
	}
	r, err := s.ReadRoute(req)
	if err != nil {
		t.Fatal(err)
	}
	if r.Immediate != nil {
		t.Fatalf("immediate %d: %s", r.Immediate.Status, r.Immediate.Body)
	}
	if got := r.Endpoints(); len(got) == 0 || got[0] != "127.0.0.1:18200" {
		t.Fatalf("destination %v, want the decode pod first", got)
	}
	if got := r.Headers.Set["x-prefiller-host-port"]; got != "127.0.0.1:18100" {
		t.Fatalf("x-prefiller-host-port = %q, want the prefill pod", got)
	}

	// /metrics exports Tandem's decision counter.
	resp, err := http.Get("http://" + a.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(text), `tandem_decisions_total{outcome="pd"`) {
		t.Fatalf("/metrics lacks the pd decision:\n%s", text)
	}
}

func TestBadSettingsFailAtStart(t *testing.T) {
	pool := writePool(t, pdPool)
	cases := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "no pool source"},
		{[]string{"--endpoints-file=" + pool, "--pool-name=x"}, nil, "exclusive"},
		{[]string{"--pool-name=x", "--pool-group=inference.networking.x-k8s.io"}, nil, "only inference.networking.k8s.io"},
		{[]string{"--endpoints-file=" + pool}, map[string]string{"AIBRIX_TOKEN_LOAD_KV_WEIGHT": "-1"}, "AIBRIX_TOKEN_LOAD_KV_WEIGHT=-1: must be positive"},
		{[]string{"--endpoints-file=" + pool}, map[string]string{"AIBRIX_BUCKET_SERVE": "true"}, "AIBRIX_PROMPT_LENGTH_BUCKETING"},
		{[]string{"--endpoints-file=" + pool}, map[string]string{"AIBRIX_TRT_MACHINE_ID": "1024"}, "AIBRIX_TRT_MACHINE_ID=1024"},
		{[]string{"--endpoints-file=" + filepath.Join(t.TempDir(), "missing.yaml")}, nil, "missing.yaml"},
		{[]string{"--endpoints-file=" + pool, "--grpc-port=19555", "--metrics-port=19555"}, nil, "--grpc-port and --metrics-port are both 19555"},
	}
	for _, tc := range cases {
		getenv := func(k string) string { return tc.env[k] }
		opts, err := ParseFlags(append([]string{"--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0"}, tc.args...), io.Discard, getenv)
		if err == nil {
			var a *App
			a, err = New(context.Background(), opts, Env{Getenv: getenv})
			if err == nil { // not expected: release the listeners
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				_ = a.Run(ctx)
			}
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("args %v env %v: error %v, want it to mention %q", tc.args, tc.env, err, tc.want)
		}
	}
}

func TestHelpListsEveryFlag(t *testing.T) {
	var out strings.Builder
	_, err := ParseFlags([]string{"--help"}, &out, func(string) string { return "" })
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("err = %v, want ErrHelp", err)
	}
	for _, f := range []string{"pool-name", "pool-namespace", "pool-group", "grpc-port", "grpc-health-port",
		"metrics-port", "secure-serving", "cert-path", "zap-encoder", "zap-log-level", "endpoints-file", "config-file", "conformance"} {
		if !strings.Contains(out.String(), "-"+f) {
			t.Errorf("--help does not list --%s", f)
		}
	}
}

// The token-load policies and the Redis-shared decode ledger are wired into the binary: the
// seed's variables select them and a pick charges the ledgers (visible as gauges).
func TestTokenLoadPoliciesAndSharedLedger(t *testing.T) {
	redis := redistest.Start(t)
	a := startAppEnv(t, map[string]string{
		"AIBRIX_PREFILL_SCORE_POLICY": "hybrid_cache_load",
		"AIBRIX_DECODE_SCORE_POLICY":  "token_load",
	}, "--endpoints-file="+writePool(t, pdPool), "--redis-addr="+redis.Addr())
	if a.shared == nil {
		t.Fatal("--redis-addr did not enable the shared decode ledger")
	}
	waitSynced(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := envoy.Dial(a.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := envoy.Request{Method: "POST", Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"` + strings.Repeat("a", 4000) + `"}`)}
	if err := s.SendRequest(req); err != nil {
		t.Fatal(err)
	}
	if r, err := s.ReadRoute(req); err != nil || r.Immediate != nil {
		t.Fatalf("route: %v %+v", err, r)
	}
	// The request is still open: the decode pod carries the prompt's tokens.
	text := scrape(t, a)
	for _, want := range []string{`pd_token_load_decode_tokens{namespace="default",pod_name="decode-0"}`,
		`pd_token_load_kv_tokens{namespace="default",pod_name="prefill-0"}`} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func waitSynced(t *testing.T, a *App) {
	t.Helper()
	changes := a.Store().Changes()
	timeout := time.After(10 * time.Second)
	for !a.Store().Load().Synced {
		select {
		case <-changes:
		case <-timeout:
			t.Fatal("pool never synced")
		}
	}
}

// waitUntil polls cond until it holds, failing the test after 15 s. Only for what no event
// marks: a stream's cleanup after its answer, a background reload or retirement, a count seen
// through Redis.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !within(15*time.Second, cond) {
		t.Fatalf("%s: not within 15s", what)
	}
}

// within polls cond every 5 ms until it holds or limit has passed, and reports whether it held.
func within(limit time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

func scrape(t *testing.T, a *App) string {
	t.Helper()
	resp, err := http.Get("http://" + a.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
