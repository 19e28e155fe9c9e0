package demo

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/gateway"
	"github.com/tandem-epp/tandem/internal/sim"
)

// Model is the model name every simulated pod serves.
const Model = "demo-model"

// BucketTokens splits the traffic: prompts below it go to the standard (combined) pod, the
// rest to prefill/decode pairs (the seed's prompt-length bucketing).
const BucketTokens = 1024

// EPPRunner runs Tandem in-process until ctx ends; app.Run has this signature.
type EPPRunner func(ctx context.Context, args []string) error

// Pod is one simulated pod of the demo.
type Pod struct {
	Name, Role, Roleset string // Role: prefill, decode or standard
	Server              *sim.Server
}

// Stack is everything the demo started.
type Stack struct {
	Pods       []*Pod
	GatewayURL string
	MetricsURL string
	Dir        string // temp dir holding the endpoints file

	stops []func()
}

// StackOptions configure Start.
type StackOptions struct {
	RunEPP    EPPRunner
	TimeScale float64 // simulator time scale (0.2: five times faster than the model)
	Listen    string  // gateway address; falls back to a free port if taken
	Logger    logr.Logger
}

// Stop stops everything, most recently started first.
func (s *Stack) Stop() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
	s.stops = nil
}

// StartStack starts the pods, Tandem (file-sourced pool) and the gateway, on loopback. On
// error everything already started is stopped.
func StartStack(ctx context.Context, o StackOptions) (st *Stack, err error) {
	st = &Stack{}
	defer func() {
		if err != nil {
			st.Stop()
		}
	}()
	st.Dir, err = os.MkdirTemp("", "tandem-demo-")
	if err != nil {
		return nil, err
	}
	st.stops = append(st.stops, func() { os.RemoveAll(st.Dir) })

	layout := []struct{ name, role, roleset string }{
		{"prefill-a", sim.RolePrefill, "rs-a"}, {"decode-a", sim.RoleDecode, "rs-a"},
		{"prefill-b", sim.RolePrefill, "rs-b"}, {"decode-b", sim.RoleDecode, "rs-b"},
		{"standard-0", sim.RoleStandard, ""},
	}
	for _, l := range layout {
		srv, err := sim.Start(ctx, sim.PodConfig{
			Name: l.name, Engine: sim.EngineVLLM, Role: l.role, Model: Model, TimeScale: o.TimeScale,
			// A decode pod can run the prefill leg itself (llm-d sidecar) or take the one
			// Tandem ran; either hand-off mode works.
			RoutingSidecar: l.role == sim.RoleDecode,
			RecordLimit:    1, // Seq still counts every request; bodies are not kept
		})
		if err != nil {
			return nil, fmt.Errorf("starting pod %s: %w", l.name, err)
		}
		st.stops = append(st.stops, srv.Close)
		role := l.role
		if role == sim.RoleStandard {
			role = "standard"
		}
		st.Pods = append(st.Pods, &Pod{Name: l.name, Role: role, Roleset: l.roleset, Server: srv})
	}
	endpoints := filepath.Join(st.Dir, "endpoints.yaml")
	if err := writeEndpoints(endpoints, st.Pods); err != nil {
		return nil, err
	}

	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	grpcPort, healthPort, metricsPort := ports[0], ports[1], ports[2]
	st.MetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	args := []string{
		"--endpoints-file", endpoints,
		"--bind-address", "127.0.0.1",
		"--grpc-port", strconv.Itoa(grpcPort),
		"--grpc-health-port", strconv.Itoa(healthPort),
		"--metrics-port", strconv.Itoa(metricsPort),
		"--debug-trace-header",
		"--zap-log-level", "info", // start-up, pool and configuration warnings; requests are not logged at info
	}
	eppCtx, stopEPP := context.WithCancel(context.Background())
	eppDone := make(chan error, 1)
	go func() { eppDone <- o.RunEPP(eppCtx, args) }()
	st.stops = append(st.stops, func() {
		stopEPP()
		select {
		case <-eppDone:
		case <-time.After(15 * time.Second):
			o.Logger.Info("Tandem did not stop within 15s; leaving it")
		}
	})
	if err := WaitServing(ctx, fmt.Sprintf("127.0.0.1:%d", healthPort), eppDone, 30*time.Second); err != nil {
		return nil, fmt.Errorf("starting Tandem (args %v): %w", args, err)
	}

	gw, err := gateway.New(gateway.Options{EPPAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort), TLS: true, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			gw.Close()
			return nil, err
		}
	}
	hs := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	st.stops = append(st.stops, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if hs.Shutdown(sctx) != nil {
			hs.Close()
		}
		gw.Close()
	})
	st.GatewayURL = "http://" + ln.Addr().String()
	return st, nil
}

// profile is the model.aibrix.ai/config annotation: the PD strategy, and the prompt-length
// bucket each pod serves.
func profile(role string) string {
	if role == "standard" {
		return fmt.Sprintf(`{"profiles":{"default":{"routingStrategy":"pd","routingConfig":{"combined":true,"promptLenBucketMinLength":0,"promptLenBucketMaxLength":%d}}}}`, BucketTokens-1)
	}
	return fmt.Sprintf(`{"profiles":{"default":{"routingStrategy":"pd","routingConfig":{"promptLenBucketMinLength":%d}}}}`, BucketTokens)
}

func writeEndpoints(path string, pods []*Pod) error {
	f := EndpointsFile{Pool: map[string]string{"name": "demo", "namespace": "default"}}
	for _, p := range pods {
		labels := map[string]string{"model.aibrix.ai/name": Model, "model.aibrix.ai/engine": "vllm"}
		if p.Role != "standard" {
			labels["role-name"] = p.Role
			labels["roleset-name"] = p.Roleset
		}
		if p.Role == sim.RoleDecode {
			// The decode pods run an llm-d-style routing sidecar and say so with llm-d's role
			// label, so the default (auto) hand-off names the prefill pod for them.
			labels["llm-d.ai/role"] = p.Role
		}
		f.Endpoints = append(f.Endpoints, SimEndpoint(p.Name, p.Server, labels,
			map[string]string{"model.aibrix.ai/config": profile(p.Role)}))
	}
	return f.Write(path)
}

// FreePorts returns n distinct loopback ports free now (held together while chosen).
func FreePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
