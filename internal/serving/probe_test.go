package serving

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/pool"
)

// probe does what grpc_health_probe (and a kubelet gRPC probe) does: a fresh connection, one
// standard grpc.health.v1 Check for service, the connection closed. It returns the status, or
// the gRPC error when the Check failed.
func probe(t *testing.T, addr string, useTLS bool, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // self-signed test certificate
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithUserAgent("grpc_health_probe"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return r.GetStatus(), err
}

// expectProbes probes every service on the health port (plain text) and the ext_proc port
// (TLS) and checks the status of each.
func expectProbes(t *testing.T, s *Server, when string, want map[string]healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	for service, st := range want {
		for _, port := range []struct {
			name string
			addr string
			tls  bool
		}{{"health port", s.HealthAddr(), false}, {"ext_proc port", s.ExtProcAddr(), true}} {
			got, err := probe(t, port.addr, port.tls, service)
			if err != nil || got != st {
				t.Errorf("%s: %s service %q = %v (%v), want %v", when, port.name, service, got, err, st)
			}
		}
	}
}

// TestHealthProbe: the health services of the Endpoint Picker Protocol (GIE v1.6, proposal
// 004), asked as a probe asks. Before the pool has synced: liveness SERVING, readiness and
// the ext_proc service NOT_SERVING. Once synced: all SERVING. During shutdown's grace period
// (a stream still open): readiness NOT_SERVING, liveness SERVING. After: nothing answers.
// The names Tandem answered before (inference-extension, "") follow readiness.
func TestHealthProbe(t *testing.T) {
	const (
		serving    = healthpb.HealthCheckResponse_SERVING
		notServing = healthpb.HealthCheckResponse_NOT_SERVING
	)
	extProc := extprocv3.ExternalProcessor_ServiceDesc.ServiceName
	if extProc != "envoy.service.ext_proc.v3.ExternalProcessor" {
		t.Fatalf("ext_proc service name %q", extProc)
	}
	readyAs := func(st healthpb.HealthCheckResponse_ServingStatus) map[string]healthpb.HealthCheckResponse_ServingStatus {
		return map[string]healthpb.HealthCheckResponse_ServingStatus{
			"liveness": serving, "readiness": st, extProc: st, "inference-extension": st, "": st,
		}
	}

	store := pool.NewStore()
	opened := openedObserver(make(chan struct{}, 1))
	s, stop, done := start(t, Config{SecureServing: true, GracePeriod: time.Minute}, store, opened)
	ctx := testCtx(t)
	hc, err := grpc.NewClient(s.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	// The watch only tells when followSync has applied a change; the probes check the result.
	ready := watchHealth(t, ctx, hc, "readiness")
	if got := ready(); got != notServing {
		t.Fatalf("readiness %v before sync", got)
	}
	expectProbes(t, s, "before sync", readyAs(notServing))
	if _, err := probe(t, s.HealthAddr(), false, "no-such-service"); status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}

	store.Publish(pool.Info{}, onePod(), true)
	if got := ready(); got != serving {
		t.Fatalf("readiness %v after sync", got)
	}
	expectProbes(t, s, "synced", readyAs(serving))

	// Hold shutdown in its grace period with an open ext_proc stream.
	c, err := envoy.Dial(s.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stream, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.SendRequestHeaders(envoy.Headers(":method", "POST", ":path", "/v1/chat/completions"), false, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-opened:
	case <-ctx.Done():
		t.Fatal("the server never opened the stream")
	}
	stopErr := make(chan error, 1)
	go func() { stopErr <- stop() }()
	if got := ready(); got != notServing {
		t.Fatalf("readiness %v after shutdown began", got)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while a stream was open", err)
	default:
	}
	// The ext_proc listener is closed by now; the health port still answers.
	during := readyAs(notServing)
	for service, st := range during {
		got, err := probe(t, s.HealthAddr(), false, service)
		if err != nil || got != st {
			t.Errorf("shutting down: service %q = %v (%v), want %v", service, got, err, st)
		}
	}

	req := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)}
	if err := stream.SendRequestBody(req.Body, true); err != nil {
		t.Fatal(err)
	}
	if routed, err := stream.ReadRoute(req); err != nil || routed.Destination != "10.0.0.1:8000" {
		t.Fatalf("the open stream was not served during the grace period: %v %+v", err, routed)
	}
	if _, err := stream.Respond(envoy.Response{Status: 200, Chunks: [][]byte{[]byte("{}")}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := <-stopErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got, err := probe(t, s.HealthAddr(), false, "liveness"); status.Code(err) != codes.Unavailable {
		t.Errorf("after shutdown: liveness %v (%v), want the port closed (Unavailable)", got, err)
	}
}
