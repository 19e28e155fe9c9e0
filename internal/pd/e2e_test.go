package pd_test

import (
	"context"
	"encoding/json"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/pool/file"
)

// End to end: a pool from the file source, the Router with every strategy, the real
// ext_proc server on a real gRPC socket on 127.0.0.1, driven the way Envoy drives it.
func TestEndToEndThroughExtProc(t *testing.T) {
	info, eps, err := file.Load("testdata/pool.yaml")
	if err != nil {
		t.Fatal(err)
	}
	store := pool.NewStore()
	store.Publish(info, eps, true)
	byHP := map[string]*pool.Endpoint{}
	for _, e := range eps {
		byHP[e.HostPort()] = e
	}

	gw := config.DefaultGateway()
	resolver, err := config.NewResolver(gw, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	deps := picker.NewDeps(nil, gw.PD.PrefixCache)
	cascade := pd.New(pd.Options{Deps: deps, Gateway: gw.PD})
	router, err := picker.NewRouter(picker.RouterOptions{Resolver: resolver, Strategies: pd.Strategies(cascade, deps, gw.PD)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, extproc.NewServer(store, router, extproc.Options{DebugTraceHeader: true}))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	client, err := envoy.Dial(lis.Addr().String(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	chat := func(tokens int) []byte {
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
			{"role": "user", "content": strings.Repeat("abcd", tokens)}}})
		return b
	}

	// A short prompt: the profile's pd strategy, a pair from one roleset.
	for range 6 {
		s, routed, err := client.Route(ctx, envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: chat(100)})
		if err != nil || routed.Immediate != nil {
			t.Fatalf("route: %v %+v", err, routed.Immediate)
		}
		dst := byHP[routed.Endpoints()[0]]
		pre := byHP[routed.Headers.Set[pd.HeaderPrefillerHostPort]]
		if dst == nil || pre == nil || dst.Role != pool.RoleDecode || pre.Role != pool.RolePrefill || dst.Roleset != pre.Roleset {
			t.Fatalf("destination %q prefill %q", routed.Destination, routed.Headers.Set[pd.HeaderPrefillerHostPort])
		}
		for _, hp := range routed.Endpoints() {
			if e := byHP[hp]; e.Role != pool.RoleDecode || e.Roleset != dst.Roleset {
				t.Fatalf("fallback %s outside the decode pods of %s", hp, dst.Roleset)
			}
		}
		ans, err := s.Respond(envoy.Response{Status: 200, Served: routed.Endpoints()[0], Chunks: [][]byte{[]byte("data: x\n\n")}})
		if err != nil {
			t.Fatal(err)
		}
		var tr picker.Trace
		if ans.Headers.Set["routing-strategy"] != "pd" || json.Unmarshal([]byte(ans.Headers.Set["x-tandem-trace"]), &tr) != nil ||
			!slices.Contains(tr.Steps, "bucketing") || !slices.Contains(tr.Steps, pd.StepPair) {
			t.Fatalf("response headers %v", ans.Headers.Set)
		}
	}
	// Every request completed: nothing is left in flight.
	for _, e := range eps {
		if cascade.PrefillInFlight(e.Key()) != 0 || cascade.PendingDecode(e.Key()) != 0 || deps.Running.InFlight(e.Key()) != 0 {
			t.Fatalf("%s still counted", e.Key())
		}
	}

	// A prompt beyond every roleset's bucket: the combined pod, no prefill target.
	_, routed, err := client.Route(ctx, envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: chat(2000)})
	if err != nil || routed.Immediate != nil {
		t.Fatalf("route: %v %+v", err, routed.Immediate)
	}
	if e := byHP[routed.Endpoints()[0]]; e == nil || e.Name != "combined" || routed.Headers.Set[pd.HeaderPrefillerHostPort] != "" {
		t.Fatalf("long prompt: destination %q headers %v", routed.Destination, routed.Headers.Set)
	}

	// A routing-strategy header naming no strategy: 400 with the routing error header.
	_, routed, err = client.Route(ctx, envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: chat(10),
		Headers: envoy.Headers("routing-strategy", "fastest")})
	if err != nil || routed.Immediate == nil || routed.Immediate.Status != 400 || routed.Immediate.Headers["x-error-routing"] != "true" {
		t.Fatalf("unknown strategy: %v %+v", err, routed.Immediate)
	}

	// A non-PD strategy on request never sends the request to a prefill pod.
	for range 10 {
		s, routed, err := client.Route(ctx, envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: chat(10),
			Headers: envoy.Headers("routing-strategy", "random")})
		if err != nil || routed.Immediate != nil {
			t.Fatalf("random: %v %+v", err, routed.Immediate)
		}
		if byHP[routed.Endpoints()[0]].Role == pool.RolePrefill {
			t.Fatalf("random sent a request to %s", routed.Destination)
		}
		if _, err := s.Respond(envoy.Response{Status: 200, Chunks: [][]byte{[]byte("{}")}}); err != nil {
			t.Fatal(err)
		}
	}
}
