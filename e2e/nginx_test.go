package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/gateway"
	"github.com/tandem-epp/tandem/internal/sim"
)

// Whole requests through the NGINX Gateway Fabric client (internal/gateway in ClientNGINX
// mode: its njs module and endpoint-picker shim, headers in `value`, no pseudo-headers, the
// destination header only, fail-open to a random pool pod) against simulated pods.

// ngfStripped are the request headers the NGINX Gateway Fabric overlay removes nginx-side
// (manifests/overlays/nginx-gateway-fabric), because NGF forwards the client's request as sent.
var ngfStripped = []string{"X-Prefiller-Host-Port", "X-Encoder-Hosts-Ports", "X-Data-Parallel-Host-Port",
	"X-Gateway-Destination-Endpoint", "X-Gateway-Destination-Endpoint-Served", "X-Gateway-Destination-Endpoint-Subset"}

// startNGINXGateway serves the NGINX client in front of the EPP at eppAddr (TLS), with the
// pool's pods as nginx's upstream, until the test ends.
func startNGINXGateway(t *testing.T, eppAddr string, pods map[string]*pod) string {
	t.Helper()
	var upstream []string
	for _, p := range pods {
		upstream = append(upstream, p.HostPort())
	}
	return serveGateway(t, gateway.Options{EPPAddr: eppAddr, TLS: true, Client: gateway.ClientNGINX,
		DefaultEndpoints: upstream, StripHeaders: ngfStripped, DecisionTimeout: 10 * time.Second})
}

// newNGINXStack is newFileStack behind the NGINX client, Tandem started with args.
func newNGINXStack(t *testing.T, env map[string]string, args []string, specs ...podSpec) *stack {
	t.Helper()
	s := &stack{t: t, pods: startPods(t, specs...), poolFile: t.TempDir() + "/endpoints.yaml"}
	var all []*pod
	for _, sp := range specs {
		all = append(all, s.pods[sp.name])
	}
	writePoolFile(t, s.poolFile, all...)
	s.tandem = startTandem(t, append([]string{"--endpoints-file=" + s.poolFile}, args...), defaultEnv(env), nil)
	s.gwURL = startNGINXGateway(t, s.tandem.ExtProcAddr(), s.pods)
	s.client = newClient()
	return s
}

// nginxServedByTandem checks a reply came from the pod Tandem picked, not from nginx's own
// fallback, and returns that pod.
func nginxServedByTandem(t *testing.T, s *stack, r reply, stream bool) *pod {
	t.Helper()
	if err := okCompletion(r, stream); err != nil {
		t.Fatal(err)
	}
	if r.header.Get(gateway.HeaderNGINXFallback) != "" {
		t.Fatalf("nginx fell back to a pool pod of its own: Tandem's answer was unusable (%v)", r)
	}
	p := s.pods[r.pod]
	if p == nil || p.HostPort() != r.header.Get(gateway.HeaderServedBy) {
		t.Fatalf("served by %q at %s, want the pod Tandem named", r.pod, r.header.Get(gateway.HeaderServedBy))
	}
	return p
}

// TestNGINXClientMultiPodPool: a pool of three standard pods behind NGINX Gateway Fabric, chat
// and completions, streamed and not. Every request reaches the pod Tandem chose (on main the
// destination listed fallbacks and nginx answered 500, "invalid port in upstream"), and
// although the client never sends the response phase, least-request picks still spread by
// load: each request stays counted on its pod for --destination-only-hold, so 30 requests in a
// row land exactly 10 on each pod (released at the end of each stream, every pod would look
// idle at every pick and the split would be left to chance: 10/10/10 has a 2.7 % chance).
func TestNGINXClientMultiPodPool(t *testing.T) {
	lr := `{"profiles":{"default":{"routingStrategy":"least-request"}}}`
	s := newNGINXStack(t, nil, nil,
		podSpec{name: "std-0", role: sim.RoleStandard, config: lr},
		podSpec{name: "std-1", role: sim.RoleStandard, config: lr},
		podSpec{name: "std-2", role: sim.RoleStandard, config: lr})
	ctx := testCtx(t, 60*time.Second)
	per := map[string]int{}
	for i := 0; i < 30; i++ {
		stream := i%2 == 0
		m := s.marker("ngf")
		var r reply
		if i%3 == 0 {
			r = s.post(ctx, "/v1/completions", completionBody(prompt(m, 64), 4, stream), nil)
		} else {
			r = s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 64), 4, stream), nil)
		}
		p := nginxServedByTandem(t, s, r, stream)
		waitReceived(t, p, m)
		per[p.name]++
	}
	if per["std-0"] != 10 || per["std-1"] != 10 || per["std-2"] != 10 {
		t.Fatalf("requests per pod %v, want 10 each: the held in-flight counts spread least-request picks", per)
	}
}

// TestNGINXClientPDPool: PD pools behind NGINX Gateway Fabric in each hand-off mode, with and
// without llm-d routing sidecars on the decode pods. The client cannot carry a hand-off (it
// drops the prefill header, the metadata and any rewritten body), so Tandem routes every PD
// request whole to a decode pod: the decode pod gets the client's body as sent and no prefill
// target (a client-sent one is stripped nginx-side by the overlay's filter), no prefill pod
// receives anything, and Tandem's decisions say routed_whole.
func TestNGINXClientPDPool(t *testing.T) {
	for _, handoff := range []string{"", "sidecar", "epp"} {
		for _, sidecar := range []bool{false, true} {
			name := fmt.Sprintf("handoff=%s/sidecar=%v", handoff, sidecar)
			if handoff == "" {
				name = fmt.Sprintf("handoff=default/sidecar=%v", sidecar)
			}
			t.Run(name, func(t *testing.T) {
				specs := pdPods("a", "b")
				for i := range specs {
					if specs[i].role == sim.RoleDecode {
						specs[i].sidecar = sidecar
					}
				}
				env := map[string]string{}
				if handoff != "" {
					env["TANDEM_PD_HANDOFF"] = handoff
				}
				s := newNGINXStack(t, env, nil, specs...)
				ctx := testCtx(t, 60*time.Second)
				for i := 0; i < 4; i++ {
					stream := i%2 == 1
					m := s.marker("ngfpd")
					body := chatBody(prompt(m, 300), 8, stream)
					r := s.post(ctx, "/v1/chat/completions", body, map[string]string{prefillerHeader: s.pods["prefill-a"].HostPort()})
					dec := nginxServedByTandem(t, s, r, stream)
					if dec.role != sim.RoleDecode {
						t.Fatalf("served by %s, want a decode pod", dec.name)
					}
					in := waitReceived(t, dec, m)
					if string(in.Body) != string(body) || in.Header.Get(prefillerHeader) != "" {
						t.Fatalf("decode pod got body %.200s with %s=%q; want the client's body and no prefill target",
							in.Body, prefillerHeader, in.Header.Get(prefillerHeader))
					}
				}
				for _, p := range []string{"prefill-a", "prefill-b"} {
					if n := countReceived(s.pods[p]); n != 0 {
						t.Fatalf("%s received %d requests; a destination-only client's PD requests must not run a prefill leg", p, n)
					}
				}
				fams, err := tandemMetrics(s.tandem.MetricsAddr())
				if err != nil {
					t.Fatal(err)
				}
				whole := 0.0
				for _, mm := range fams["tandem_decisions_total"].GetMetric() {
					for _, l := range mm.GetLabel() {
						if l.GetName() == "step" && strings.HasSuffix(l.GetValue(), "+routed_whole") {
							whole += mm.GetCounter().GetValue()
						}
					}
				}
				if whole != 4 {
					t.Errorf("tandem_decisions_total with a +routed_whole step = %v, want 4", whole)
				}
			})
		}
	}
}

// TestNGINXClientErrorsFailOpen: NGINX Gateway Fabric turns any answer but a 200 with a
// destination into a request to a pool pod of nginx's choosing, so Tandem's errors do not reach
// the client: a request without a model still gets the engine's own answer.
func TestNGINXClientErrorsFailOpen(t *testing.T) {
	lr := `{"profiles":{"default":{"routingStrategy":"least-request"}}}`
	s := newNGINXStack(t, nil, nil, podSpec{name: "std-0", role: sim.RoleStandard, config: lr},
		podSpec{name: "std-1", role: sim.RoleStandard, config: lr})
	r := s.post(testCtx(t, 20*time.Second), "/v1/chat/completions", []byte(`{"messages":[{"role":"user","content":"hi"}]}`), nil)
	served := r.header.Get(gateway.HeaderServedBy)
	if r.err != nil || r.header.Get(gateway.HeaderNGINXFallback) != "true" ||
		(served != s.pods["std-0"].HostPort() && served != s.pods["std-1"].HostPort()) {
		t.Fatalf("want nginx's own pick of a pool pod after Tandem's 400: %v (fallback %q, served by %q)", r, r.header.Get(gateway.HeaderNGINXFallback), served)
	}
	// The answer is the engine's, not Tandem's: no x-error-routing header.
	if r.header.Get("X-Error-Routing") != "" {
		t.Errorf("Tandem's error reached the client through NGINX: %v", r.header)
	}
}
