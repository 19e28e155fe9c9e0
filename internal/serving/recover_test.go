package serving

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/pool"
)

// panicky is an ext_proc server whose handler panics on every stream.
type panicky struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (panicky) Process(extprocv3.ExternalProcessor_ProcessServer) error { panic("handler bug") }

// TestPanicEscapingAHandlerFailsThatCallOnly: the ext_proc server recovers its own panics per
// stream; whatever escapes a handler anyway is the interceptors' to catch: that call gets an
// Internal status, the panic is reported with its stack, and the servers (and health) go on.
func TestPanicEscapingAHandlerFailsThatCallOnly(t *testing.T) {
	store := pool.NewStore()
	store.Publish(pool.Info{Name: "p"}, onePod(), true)
	var mu sync.Mutex
	var reports []string
	cfg := Config{Host: "127.0.0.1", Recovered: func(method string, v any, stack []byte) {
		mu.Lock()
		defer mu.Unlock()
		if !strings.Contains(string(stack), "panicky") {
			t.Errorf("stack does not show the panic's origin:\n%s", stack)
		}
		reports = append(reports, method)
	}}
	s, err := New(cfg, panicky{}, store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	c, err := envoy.Dial(s.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		st, err := c.Open(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		_ = st.SendRequestHeaders(envoy.Headers(":method", "GET"), true, nil)
		if _, err := st.Recv(); status.Code(err) != codes.Internal {
			t.Fatalf("got %v, want an Internal status", err)
		}
	}
	mu.Lock()
	if len(reports) != 3 || reports[0] != "/envoy.service.ext_proc.v3.ExternalProcessor/Process" {
		t.Errorf("reports %q, want the Process method three times", reports)
	}
	mu.Unlock()
	host, port, _ := net.SplitHostPort(s.HealthAddr())
	hc, err := grpc.NewClient(net.JoinHostPort(host, port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	for {
		r, err := healthpb.NewHealthClient(hc).Check(testCtx(t), &healthpb.HealthCheckRequest{Service: "inference-extension"})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
}
