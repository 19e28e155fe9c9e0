package conformance_test

// The rules GIE v1.6.0 added to the Endpoint Picker Protocol (proposal 004) and to the
// InferencePool it serves, each checked over real ext_proc streams as Envoy drives them. The
// table in README.md maps every MUST and SHOULD to its test.

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
)

// otherPool is a second InferencePool's endpoints (another namespace, other IPs).
func otherPool() []*pool.Endpoint {
	return []*pool.Endpoint{
		pool.NewEndpoint("other", "x", "10.1.0.1", 8000, 0, nil, nil),
		pool.NewEndpoint("other", "y", "10.1.0.2", 8000, 0, nil, nil),
		pool.NewEndpoint("other", "z", "10.1.0.3", 8000, 0, nil, nil),
	}
}

var otherPoolHostPorts = []string{"10.1.0.1:8000", "10.1.0.2:8000", "10.1.0.3:8000"}

// ends collects the routes an EPP's outcome recorder ends.
type ends chan outcome.Route

func (e ends) Observe(ev *outcome.Event) {
	if ev.Phase == outcome.PhaseEnd {
		e <- ev.Route
	}
}

func recorder() (*outcome.Recorder, ends) {
	rec, e := outcome.NewRecorder(nil), make(ends, 16)
	rec.Subscribe(e)
	return rec, e
}

func (e ends) next(t *testing.T) outcome.Route {
	t.Helper()
	select {
	case r := <-e:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("no route ended")
		return outcome.Route{}
	}
}

func keyOf(t *testing.T, p *protoTandem, hostPort string) string {
	t.Helper()
	e, ok := p.store.Load().ByHostPort(hostPort)
	if !ok {
		t.Fatalf("%s is not in the pool", hostPort)
	}
	return e.Key()
}

// TestV16PoolScopedEndpointLists: the ordered endpoint list (primary and fallbacks) is scoped
// to the InferencePool whose EPP was invoked. Two pools, one EPP each; whatever the request
// carries (nothing, a subset hint or a conformance selection naming both pools' endpoints,
// as the upstream weighted two-pool test does), each EPP lists only its own pool's.
func TestV16PoolScopedEndpointLists(t *testing.T) {
	union := append(slices.Clone(protoPoolHostPorts), otherPoolHostPorts...)
	joined := ""
	for i, hp := range union {
		if i > 0 {
			joined += ","
		}
		joined += hp
	}
	epps := []struct {
		name string
		p    *protoTandem
		own  []string
	}{
		{"pool app", startProtoTandem(t, extproc.Options{ConformanceMode: true}, protoPool(), true), protoPoolHostPorts},
		{"pool other", startProtoTandem(t, extproc.Options{ConformanceMode: true}, otherPool(), true), otherPoolHostPorts},
	}
	for _, epp := range epps {
		for _, tc := range []struct {
			name      string
			subset    any
			selection string
		}{
			{"no hint", nil, ""},
			{"subset hint naming both pools", union, ""},
			{"selection naming both pools", nil, joined},
		} {
			t.Run(epp.name+"/"+tc.name, func(t *testing.T) {
				for range 8 {
					req := protoPost("/v1/chat/completions", protoChat)
					req.Subset = tc.subset
					if tc.selection != "" {
						req.Headers = envoy.Headers("test-epp-endpoint-selection", tc.selection)
					}
					_, routed := epp.p.route(t, req)
					if eps := protoMustRoute(t, req, routed, epp.own); len(eps) < 2 {
						t.Errorf("destination %q: want the primary and fallbacks", routed.Destination)
					}
				}
			})
		}
	}
}

// TestV16FailoverToAnotherPool: when the gateway fails over to another InferencePool it
// invokes that pool's EPP afresh; the first EPP's stream ends without a response and the
// served endpoint is reported to the second EPP only, which attributes the response to it.
// Neither EPP ever lists the other's endpoints.
func TestV16FailoverToAnotherPool(t *testing.T) {
	recA, endsA := recorder()
	recB, endsB := recorder()
	a := startProtoTandem(t, extproc.Options{Outcomes: recA}, protoPool(), true)
	b := startProtoTandem(t, extproc.Options{Outcomes: recB}, otherPool(), true)
	req := protoPost("/v1/chat/completions", protoChat)

	sa, routedA := a.route(t, req)
	protoMustRoute(t, req, routedA, protoPoolHostPorts)
	// Every endpoint of pool app refused: the gateway gives up on it without a response.
	if err := sa.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if r := endsA.next(t); r.Err == nil || r.Status != 0 || r.Served != "" {
		t.Errorf("pool app's route ended %+v, want an error with no response and no served endpoint", r)
	}

	sb, routedB := b.route(t, req)
	eps := protoMustRoute(t, req, routedB, otherPoolHostPorts)
	served := eps[len(eps)-1]
	if _, err := sb.Respond(envoy.Response{Status: 200, Served: served, Chunks: [][]byte{[]byte("{}")}}); err != nil {
		t.Fatal(err)
	}
	if err := sb.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if r := endsB.next(t); r.Err != nil || r.Status != 200 || r.Served != keyOf(t, b, served) {
		t.Errorf("pool other's route ended %+v, want status 200 served by %s", r, keyOf(t, b, served))
	}
}

// TestV16ServedAfterFailover: the gateway went down the list (the primary refused) and
// reports the fallback that served in envoy.lb / x-gateway-destination-endpoint-served. The
// EPP attributes the response to that endpoint, not to the primary, and the conformance
// echo names it.
func TestV16ServedAfterFailover(t *testing.T) {
	rec, ended := recorder()
	p := startProtoTandem(t, extproc.Options{ConformanceMode: true, Outcomes: rec}, protoPool(), true)
	req := protoPost("/v1/chat/completions", protoChat)
	s, routed := p.route(t, req)
	eps := protoMustRoute(t, req, routed, protoPoolHostPorts)
	if len(eps) < 2 {
		t.Fatalf("destination %q has no fallback", routed.Destination)
	}
	ans, err := s.Respond(envoy.Response{Status: 200, Served: eps[1], Chunks: [][]byte{[]byte("{}")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := ans.Headers.Set["x-conformance-test-served-endpoint"]; got != eps[1] {
		t.Errorf("x-conformance-test-served-endpoint %q, want the fallback %s", got, eps[1])
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	r := ended.next(t)
	if r.Destination != keyOf(t, p, eps[0]) || r.Served != keyOf(t, p, eps[1]) || r.ServedBy() != keyOf(t, p, eps[1]) {
		t.Errorf("route destination %q served %q, want %q served by the fallback %q", r.Destination, r.Served, keyOf(t, p, eps[0]), keyOf(t, p, eps[1]))
	}
	if !slices.Contains(r.Fallbacks, keyOf(t, p, eps[1])) {
		t.Errorf("route fallbacks %v do not hold the served fallback", r.Fallbacks)
	}
}

// TestV16AppProtocol: the pool's appProtocol (http, the default, or kubernetes.io/h2c) is how
// the gateway speaks to the model servers; the EPP routes both alike, pins every endpoint on
// request, and reports the served endpoint back, as the upstream InferencePoolAppProtocol test
// checks through a gateway.
func TestV16AppProtocol(t *testing.T) {
	for _, proto := range []string{"http", "kubernetes.io/h2c"} {
		t.Run(proto, func(t *testing.T) {
			p := startProtoTandem(t, extproc.Options{ConformanceMode: true}, nil, false)
			p.store.Publish(pool.Info{Name: "pool", Namespace: "app", TargetPorts: []int32{8000, 8002}, AppProtocol: proto}, protoPool(), true)
			for _, hp := range protoPoolHostPorts {
				req := protoPost("/v1/chat/completions", protoChat)
				req.Headers = envoy.Headers("test-epp-endpoint-selection", hp)
				s, routed := p.route(t, req)
				if eps := protoMustRoute(t, req, routed, []string{hp}); eps[0] != hp {
					t.Fatalf("selection %s routed to %v", hp, eps)
				}
				ans, err := s.Respond(envoy.Response{Status: 200, Served: hp, Chunks: [][]byte{[]byte("{}")}})
				if err != nil {
					t.Fatal(err)
				}
				if got := ans.Headers.Set["x-conformance-test-served-endpoint"]; got != hp {
					t.Errorf("served endpoint header %q, want %s", got, hp)
				}
			}
		})
	}
}

// TestV16DroppedRequestIs429: a request the EPP drops rather than routes is an
// ImmediateResponse 429 (here: over the limit of open requests), never a broken stream.
func TestV16DroppedRequestIs429(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{Limits: extproc.Limits{MaxStreams: 1}}, protoPool(), true)
	ctx := protoCtx(t)
	held, err := p.client.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The held stream is routed (so it certainly counts as open) and not yet answered.
	req := protoPost("/v1/chat/completions", protoChat)
	if err := held.SendRequest(req); err != nil {
		t.Fatal(err)
	}
	if routed, err := held.ReadRoute(req); err != nil || routed.Immediate != nil {
		t.Fatalf("the first request: %v %+v", err, routed)
	}
	_, routed := p.route(t, req)
	protoExpectError(t, routed, 429, "")
	if routed.Immediate != nil && routed.Immediate.Headers["retry-after"] == "" {
		t.Errorf("429 headers %v: want retry-after", routed.Immediate.Headers)
	}
}

// TestV16HealthServices: the three health services of proposal 004 on the health port, asked
// as a probe does (one Check): liveness SERVING from the start; readiness and the ext_proc
// service NOT_SERVING until the pool has synced, then SERVING.
func TestV16HealthServices(t *testing.T) {
	p := startProtoTandem(t, extproc.Options{}, nil, false)
	ctx := protoCtx(t)
	conn, err := grpc.NewClient(p.server.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		r, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("Check %q: %v", service, err)
		}
		return r.GetStatus()
	}
	const extProc = "envoy.service.ext_proc.v3.ExternalProcessor"
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("readiness before sync: %v %v", r.GetStatus(), err)
	}
	for service, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
		"liveness": healthpb.HealthCheckResponse_SERVING, "readiness": healthpb.HealthCheckResponse_NOT_SERVING, extProc: healthpb.HealthCheckResponse_NOT_SERVING,
	} {
		if got := check(service); got != want {
			t.Errorf("before sync: %q %v, want %v", service, got, want)
		}
	}
	p.store.Publish(pool.Info{Name: "pool", Namespace: "app"}, protoPool(), true)
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("readiness after sync: %v %v", r.GetStatus(), err)
	}
	for _, service := range []string{"liveness", "readiness", extProc} {
		if got := check(service); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("synced: %q %v, want SERVING", service, got)
		}
	}
}
