//go:build !nokube

// Package apptest runs a whole Tandem in-process for tests: the real command line through
// internal/app on free loopback ports, stopped when the test ends. It owns no logic of its own
// and is imported by tests only (which run the full build, not -tags nokube).
package apptest

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/client-go/rest"

	"github.com/tandem-epp/tandem/internal/app"
)

// Options describe the Tandem to start.
type Options struct {
	// Args are epp flags added to the test defaults (free ports on 127.0.0.1, /metrics on a
	// free port, errors-only logging).
	Args []string
	// Env is Tandem's whole environment (AIBRIX_* variables and the like).
	Env map[string]string
	// RestConfig reaches a Kubernetes apiserver for --pool-name (nil for --endpoints-file).
	RestConfig *rest.Config
	// Limit bounds the wait for health SERVING (default 30s).
	Limit time.Duration
	// Persist keeps Tandem running until the process ends instead of stopping it with the
	// test: for fuzz targets, whose many calls share one.
	Persist bool
}

// persisted holds the stop functions of Tandems started with Persist.
var persisted []context.CancelFunc

// newMu serialises app.New, which sets controller-runtime's global logger.
var newMu sync.Mutex

// Start runs Tandem until the test ends and returns once its gRPC health is SERVING (the pool
// source has published a synced pool).
func Start(t testing.TB, o Options) *app.App {
	t.Helper()
	if o.Limit == 0 {
		o.Limit = 30 * time.Second
	}
	getenv := func(k string) string { return o.Env[k] }
	base := []string{"--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0", "--bind-address=127.0.0.1",
		"--zap-log-level=error"}
	opts, err := app.ParseFlags(append(base, o.Args...), io.Discard, getenv)
	if err != nil {
		t.Fatalf("tandem flags: %v", err)
	}
	opts.ServeMetricsOnFreePort()
	var environ []string
	for k, v := range o.Env {
		environ = append(environ, k+"="+v)
	}
	newMu.Lock()
	a, err := app.New(context.Background(), opts, app.Env{Getenv: getenv, Environ: environ, RestConfig: o.RestConfig})
	newMu.Unlock()
	if err != nil {
		t.Fatalf("tandem: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	if o.Persist {
		newMu.Lock()
		persisted = append(persisted, cancel) // never called: the process ends first
		newMu.Unlock()
		WaitServing(t, a.HealthAddr(), done, o.Limit)
		return a
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("tandem Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("tandem did not stop within 15s")
		}
	})
	WaitServing(t, a.HealthAddr(), done, o.Limit)
	return a
}

// WaitServing watches gRPC health at addr until "inference-extension" is SERVING, failing the
// test if exited delivers first or limit passes.
func WaitServing(t testing.TB, addr string, exited <-chan error, limit time.Duration) {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "inference-extension"})
	if err != nil {
		t.Fatalf("health watch on %s: %v", addr, err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			select {
			case e := <-exited:
				t.Fatalf("tandem exited before SERVING: %v", e)
			default:
			}
			t.Fatalf("tandem health on %s not SERVING within %v: %v", addr, limit, err)
		}
		if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}
