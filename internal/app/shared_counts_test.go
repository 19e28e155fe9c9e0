package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger/redistest"
)

// replicaPair is two EPP replicas, each as cmd/epp wires it, over one pool file and one real
// redis-server, both reached over real gRPC.
type replicaPair struct {
	a, b *App
	keys map[string]string // pod name -> endpoint key
}

func startPair(t *testing.T, poolYAML string, env map[string]string, addrFlag bool) *replicaPair {
	t.Helper()
	redis := redistest.Start(t)
	path := writePool(t, poolYAML)
	start := func() *App {
		// The pods are bare listeners: the sidecar hand-off routes without a prefill leg. Their
		// scrapes fail, so passive health would eject them (as many as its cap allows) and route
		// around them: it is off here, where only the shared counts decide.
		e := map[string]string{"TANDEM_PD_HANDOFF": "sidecar", "TANDEM_OUTLIER_DETECTION": "false"}
		for k, v := range env {
			e[k] = v
		}
		args := []string{"--endpoints-file=" + path}
		if addrFlag {
			args = append(args, "--redis-addr="+redis.Addr())
		} else { // AIBrix's variables
			host, port, _ := net.SplitHostPort(redis.Addr())
			e["REDIS_HOST"], e["REDIS_PORT"] = host, port
		}
		a := startAppEnv(t, e, args...)
		waitSynced(t, a)
		return a
	}
	p := &replicaPair{a: start(), b: start(), keys: map[string]string{}}
	for _, e := range p.a.Store().Load().Endpoints {
		p.keys[e.Name] = e.Key()
	}
	return p
}

// open sends one request to a and reads its route; the request stays open (no response) until
// the test ends, holding its load.
func open(t *testing.T, a *App, headers []envoy.Header, subset []string, body string) *envoy.Routed {
	t.Helper()
	c, err := envoy.Dial(a.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := envoy.Request{Method: "POST", Path: "/v1/completions", Headers: headers, Body: []byte(body)}
	if subset != nil {
		req.Subset = subset
	}
	if err := s.SendRequest(req); err != nil {
		t.Fatal(err)
	}
	r, err := s.ReadRoute(req)
	if err != nil || r.Immediate != nil {
		t.Fatalf("route: %v %+v", err, r)
	}
	return r
}

// complete runs one request on a to the end (response headers and body), so its completion
// counts in the pods' drain rates.
func complete(t *testing.T, c *envoy.Client, subset []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := envoy.Request{Method: "POST", Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"hi"}`), Subset: subset}
	if err := s.SendRequest(req); err != nil {
		t.Fatal(err)
	}
	r, err := s.ReadRoute(req)
	if err != nil || r.Immediate != nil {
		t.Fatalf("route: %v %+v", err, r)
	}
	if err := s.SendResponseHeaders(200, nil, false, envoy.Served(r.Endpoints()[0])); err != nil {
		t.Fatal(err)
	}
	if err := s.SendResponseBody([]byte("{}"), true); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
}

const twoRolesets = `
endpoints:
- {name: p0, address: 127.0.0.1, port: 18100, labels: {role-name: prefill, roleset-name: rs0, model.aibrix.ai/name: m}}
- {name: d0, address: 127.0.0.1, port: 18200, labels: {role-name: decode, roleset-name: rs0, model.aibrix.ai/name: m}}
- {name: p1, address: 127.0.0.2, port: 18100, labels: {role-name: prefill, roleset-name: rs1, model.aibrix.ai/name: m}}
- {name: d1, address: 127.0.0.2, port: 18200, labels: {role-name: decode, roleset-name: rs1, model.aibrix.ai/name: m}}
`

// TestReplicasShareRequestCounts: with Redis, each replica sees the requests the other routed,
// in one pipelined round trip with the decode ledger: least_request sends its own requests away
// from the pod the other replica loaded, and the prefill and decode load-imbalance fast paths fire
// on the other replica's load. Without sharing, each replica would see idle pods and choose at
// random (half the time the loaded ones). Redis is configured once with --redis-addr, once with
// AIBrix's REDIS_HOST and REDIS_PORT.
func TestReplicasShareRequestCounts(t *testing.T) {
	t.Run("least_request", func(t *testing.T) {
		p := startPair(t, twoRolesets, nil, true)
		lr := []envoy.Header{{Key: "routing-strategy", Value: "least-request"}}
		for range 3 { // replica A loads d0
			if r := open(t, p.a, lr, []string{"127.0.0.1:18200"}, `{"model":"m","prompt":"hi"}`); r.Endpoints()[0] != "127.0.0.1:18200" {
				t.Fatalf("replica A routed to %v", r.Endpoints())
			}
		}
		waitUntil(t, "replica B sees A's requests on d0", func() bool { return p.b.Deps().Running.InFlight(p.keys["d0"]) == 3 })
		for i := range 2 { // 3 on d0 against 0, then 1, on d1
			if r := open(t, p.b, lr, nil, `{"model":"m","prompt":"hi"}`); r.Endpoints()[0] != "127.0.0.2:18200" {
				t.Errorf("replica B's request %d went to %v, not to the idle d1", i, r.Endpoints())
			}
		}
	})
	t.Run("fast paths", func(t *testing.T) {
		env := map[string]string{"AIBRIX_PREFILL_LOAD_IMBALANCE_MIN_SPREAD": "2", "AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD": "2"}
		p := startPair(t, twoRolesets, env, false)
		rs0 := []string{"127.0.0.1:18100", "127.0.0.1:18200"}
		for range 3 { // replica A: three PD requests on rs0, prefilling (sidecar) and pending decode
			if r := open(t, p.a, nil, rs0, `{"model":"m","prompt":"hi"}`); r.Endpoints()[0] != "127.0.0.1:18200" {
				t.Fatalf("replica A routed to %v", r.Endpoints())
			}
		}
		waitUntil(t, "replica B sees A's prefills and pending decodes", func() bool {
			return p.b.Cascade().PrefillInFlight(p.keys["p0"]) == 3 && p.b.Cascade().PendingDecode(p.keys["d0"]) == 3
		})
		r := open(t, p.b, nil, nil, `{"model":"m","prompt":"hi"}`)
		if r.Endpoints()[0] != "127.0.0.2:18200" || r.Headers.Set["x-prefiller-host-port"] != "127.0.0.2:18100" {
			t.Errorf("replica B routed to %v, prefill %s; want the idle rs1 pair", r.Endpoints(), r.Headers.Set["x-prefiller-host-port"])
		}
	})
}

// TestReplicasShareDrainRatesForTheOverflowCheck: the combined overflow check divides a PD pod's
// engine backlog by its drain rate. Replica A completes requests on p0 (one waiting request,
// scraped); shared, replica B sees p0 draining faster than its backlog (score below 1) and keeps
// PD; alone, B saw p0 drain nothing (a score of 100) and sent its request to the idle standard pod.
func TestReplicasShareDrainRatesForTheOverflowCheck(t *testing.T) {
	metricsOf := func(waiting int) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			_, _ = io.WriteString(w, fmt.Sprintf("vllm:num_requests_waiting{model_name=\"m\"} %d\nvllm:num_requests_running{model_name=\"m\"} 0\n", waiting))
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	pod := func(name, labels string, srv *httptest.Server, extra string) string {
		host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		return fmt.Sprintf("- {name: %s, address: %s, port: %s, labels: {%s, model.aibrix.ai/name: m}%s}\n", name, host, port, labels, extra)
	}
	p0, d0, c0 := metricsOf(1), metricsOf(0), metricsOf(0)
	poolYAML := "endpoints:\n" + pod("p0", "role-name: prefill, roleset-name: rs0", p0, "") +
		pod("d0", "role-name: decode, roleset-name: rs0", d0, "") +
		pod("c0", "role-name: standard, roleset-name: std", c0,
			`, annotations: {model.aibrix.ai/config: '{"profiles":{"default":{"routingConfig":{"combined":true}}}}'}`)
	env := map[string]string{"AIBRIX_PROMPT_LENGTH_BUCKETING": "true", "AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "50"}
	p := startPair(t, poolYAML, env, true)
	host, port, _ := net.SplitHostPort(p0.Listener.Addr().String())
	dhost, dport, _ := net.SplitHostPort(d0.Listener.Addr().String())
	rs0 := []string{net.JoinHostPort(host, port), net.JoinHostPort(dhost, dport)}
	// Before A drained anything, B's check finds p0 saturated and the standard pod idle.
	waitUntil(t, "replica B scrapes p0's backlog", func() bool {
		smp := p.b.Deps().Metrics.Get(p.keys["p0"])
		return smp != nil && smp.HasWaiting && smp.Waiting == 1
	})
	chost, cport, _ := net.SplitHostPort(c0.Listener.Addr().String())
	if r := open(t, p.b, nil, nil, `{"model":"m","prompt":"hi"}`); r.Endpoints()[0] != net.JoinHostPort(chost, cport) {
		t.Fatalf("before any completion replica B routed to %v, want the standard pod (combined overflow)", r.Endpoints())
	}
	c, err := envoy.Dial(p.a.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 90 { // 1.5 completions a second on p0 over the last minute: 1 waiting / 1.5 = 0.67
		complete(t, c, rs0)
	}
	waitUntil(t, "replica B sees p0 drain and its scraped backlog", func() bool {
		smp := p.b.Deps().Metrics.Get(p.keys["p0"])
		return p.b.Deps().Drain.PerSecond(p.keys["p0"]) >= 1.4 && smp != nil && smp.HasWaiting && smp.Waiting == 1
	})
	r := open(t, p.b, nil, nil, `{"model":"m","prompt":"hi"}`)
	if got := r.Endpoints()[0]; got != rs0[1] {
		t.Errorf("replica B routed to %s, want the PD pair's decode pod %s (not the standard pod: PD is not saturated)", got, rs0[1])
	}
	if !strings.Contains(r.Headers.Set["x-prefiller-host-port"], host) {
		t.Errorf("no prefill target for a PD pair: %v", r.Headers.Set)
	}
}

// TestRedisAddressPrecedence: --redis-addr, else TANDEM_REDIS_ADDR, else AIBrix's REDIS_HOST
// with REDIS_PORT (default 6379); the password likewise from --redis-password,
// TANDEM_REDIS_PASSWORD, REDIS_PASSWORD.
func TestRedisAddressPrecedence(t *testing.T) {
	cases := []struct {
		env              map[string]string
		args             []string
		wantAddr, wantPw string
	}{
		{map[string]string{"REDIS_HOST": "redis.aibrix", "REDIS_PORT": "6380", "REDIS_PASSWORD": "a"}, nil, "redis.aibrix:6380", "a"},
		{map[string]string{"REDIS_HOST": "redis.aibrix"}, nil, "redis.aibrix:6379", ""},
		{map[string]string{"REDIS_HOST": "redis.aibrix", "TANDEM_REDIS_ADDR": "t:1", "REDIS_PASSWORD": "a", "TANDEM_REDIS_PASSWORD": "t"}, nil, "t:1", "t"},
		{map[string]string{"REDIS_HOST": "redis.aibrix", "TANDEM_REDIS_ADDR": "t:1"}, []string{"--redis-addr=f:2", "--redis-password=f"}, "f:2", "f"},
		{map[string]string{"REDIS_PORT": "6380"}, nil, "", ""}, // a port alone names no server
		// Kubernetes sets REDIS_PORT to a service link in every pod of a namespace with a Service
		// named redis; REDIS_HOST set alone then still means port 6379 of that Service.
		{map[string]string{"REDIS_HOST": "redis", "REDIS_PORT": "tcp://10.96.0.5:6379"}, nil, "redis:6379", ""},
	}
	for _, c := range cases {
		o, err := ParseFlags(append([]string{"--endpoints-file=x"}, c.args...), io.Discard, func(k string) string { return c.env[k] })
		if err != nil {
			t.Fatal(err)
		}
		if o.RedisAddr != c.wantAddr || o.RedisPassword != c.wantPw {
			t.Errorf("env %v args %v: addr %q password %q, want %q %q", c.env, c.args, o.RedisAddr, o.RedisPassword, c.wantAddr, c.wantPw)
		}
	}
	// A REDIS_PORT that is no port is refused, naming the variable (not --redis-addr).
	_, err := ParseFlags([]string{"--endpoints-file=x"}, io.Discard, func(k string) string {
		return map[string]string{"REDIS_HOST": "redis", "REDIS_PORT": "63 79"}[k]
	})
	if err == nil || !strings.Contains(err.Error(), "REDIS_PORT") {
		t.Errorf("REDIS_PORT=\"63 79\": %v, want an error naming REDIS_PORT", err)
	}
}

// TANDEM_REDIS_TLS takes every boolean spelling; anything else stops Tandem naming the
// variable, since a typo would otherwise send the Redis password in plain text.
func TestRedisTLSFromTheEnvironment(t *testing.T) {
	for raw, want := range map[string]bool{"true": true, "1": true, "TRUE": true, "false": false, "0": false, "": false} {
		o, err := ParseFlags([]string{"--endpoints-file=x"}, io.Discard, func(k string) string {
			return map[string]string{"TANDEM_REDIS_TLS": raw}[k]
		})
		if err != nil || o.RedisTLS != want {
			t.Errorf("TANDEM_REDIS_TLS=%q: tls %v, %v; want %v", raw, o != nil && o.RedisTLS, err, want)
		}
	}
	_, err := ParseFlags([]string{"--endpoints-file=x"}, io.Discard, func(k string) string {
		return map[string]string{"TANDEM_REDIS_TLS": "maybe"}[k]
	})
	if err == nil || !strings.Contains(err.Error(), "TANDEM_REDIS_TLS") {
		t.Errorf("TANDEM_REDIS_TLS=maybe: %v, want an error naming it", err)
	}
	// The flag on the command line wins over the variable, either way.
	for _, tc := range []struct {
		flag, env string
		want      bool
	}{{"--redis-tls=false", "true", false}, {"--redis-tls", "false", true}} {
		o, err := ParseFlags([]string{"--endpoints-file=x", tc.flag}, io.Discard, func(k string) string {
			return map[string]string{"TANDEM_REDIS_TLS": tc.env}[k]
		})
		if err != nil || o.RedisTLS != tc.want {
			t.Errorf("%s with TANDEM_REDIS_TLS=%s: tls %v, %v; want %v", tc.flag, tc.env, o != nil && o.RedisTLS, err, tc.want)
		}
	}
	if _, err := ParseFlags([]string{"--endpoints-file=x", "--redis-tls=false"}, io.Discard, func(k string) string {
		return map[string]string{"TANDEM_REDIS_TLS": "maybe"}[k]
	}); err == nil || !strings.Contains(err.Error(), "TANDEM_REDIS_TLS") {
		t.Errorf("--redis-tls=false with TANDEM_REDIS_TLS=maybe: %v, want an error naming the variable", err)
	}
	env := map[string]string{"TANDEM_REDIS_ADDR": "redis-a:6379", "REDIS_HOST": "redis-b", "TANDEM_REDIS_PASSWORD": "p1", "REDIS_PASSWORD": "p2"}
	for _, tc := range []struct {
		flags          []string
		addr, password string
	}{
		{nil, "redis-a:6379", "p1"},
		{[]string{"--redis-addr=", "--redis-password="}, "", ""},
		{[]string{"--redis-addr=redis-c:1", "--redis-password=p3"}, "redis-c:1", "p3"},
	} {
		o, err := ParseFlags(append([]string{"--endpoints-file=x"}, tc.flags...), io.Discard, func(k string) string { return env[k] })
		if err != nil {
			t.Errorf("%v: %v", tc.flags, err)
			continue
		}
		if o.RedisAddr != tc.addr || o.RedisPassword != tc.password {
			t.Errorf("%v: addr %q, password %q; want %q, %q", tc.flags, o.RedisAddr, o.RedisPassword, tc.addr, tc.password)
		}
	}
}
