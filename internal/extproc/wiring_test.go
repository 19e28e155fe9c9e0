package extproc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/app/apptest"
	"github.com/tandem-epp/tandem/internal/outcome"
)

// TestRoutedWholeAsWired: Tandem wired as cmd/epp wires it (telemetry wraps every lifecycle), a
// pair routed whole for a destination-only client. Its outcome record says no prefill leg ran,
// passive health, which reads the same record, credits the prefill pod with nothing (a leg that
// never ran must not clear a failure it had), and its drain rate counts no completion.
func TestRoutedWholeAsWired(t *testing.T) {
	pre, dec := fuzzPod(), fuzzPod()
	t.Cleanup(pre.Close)
	t.Cleanup(dec.Close)
	var pool string
	for _, p := range []struct{ name, role, addr string }{{"prefill-0", "prefill", pre.Listener.Addr().String()}, {"decode-0", "decode", dec.Listener.Addr().String()}} {
		host, port, _ := net.SplitHostPort(p.addr)
		pool += fmt.Sprintf("- name: %s\n  address: %s\n  port: %s\n  labels: {model.aibrix.ai/name: m, model.aibrix.ai/engine: vllm, role-name: %s, roleset-name: rs-0}\n", p.name, host, port, p.role)
	}
	path := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(path, []byte("endpoints:\n"+pool), 0o600); err != nil {
		t.Fatal(err)
	}
	a := apptest.Start(t, apptest.Options{Args: []string{"--endpoints-file=" + path, "--gateway-client=destination-only"}, Env: map[string]string{}})
	var mu sync.Mutex
	var ends []outcome.Route // the prefill ends of every outcome record
	a.Deps().Outcomes.Subscribe(observeFunc(func(e *outcome.Event) {
		if e.Phase == outcome.PhasePrefillEnd {
			mu.Lock()
			ends = append(ends, e.Route)
			mu.Unlock()
		}
	}))
	var prefill string
	for _, e := range a.Store().Load().Endpoints {
		if e.Name == "prefill-0" {
			prefill = e.Key()
		}
	}
	// The prefill pod's last leg could not connect.
	failed := a.Deps().Outcomes.Start(outcome.KindPD, prefill, "ns/elsewhere:1", 1)
	failed.PrefillEnd(&outcome.Failure{Origin: outcome.OriginGateway, Err: errors.New("connection refused")}, true)
	failed.End(errors.New("connection refused"))
	if st := a.Health().Status(prefill); st.ConsGateway != 1 {
		t.Fatalf("setup: the prefill pod's failure was not counted: %+v", st)
	}

	c, err := envoy.Dial(a.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, routed, err := c.Route(ctx, envoy.Request{Method: "POST", Path: "/v1/chat/completions",
		Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)})
	if err != nil || routed.Immediate != nil {
		t.Fatalf("route: %v %+v", err, routed)
	}
	_ = s.CloseSend()
	mu.Lock()
	got := ends
	mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("%d prefill ends, want the setup's and the routed request's", len(got))
	}
	if r := got[1]; r.Kind != outcome.KindPD || r.Prefill != prefill || !errors.Is(r.PrefillErr, outcome.ErrPrefillNotRun) || r.PrefillObserved {
		t.Errorf("the pair routed whole: kind %v prefill %s leg %v observed %v; want a pair whose leg did not run", r.Kind, r.Prefill, r.PrefillErr, r.PrefillObserved)
	}
	if st := a.Health().Status(prefill); st.ConsGateway != 1 {
		t.Errorf("a pair routed whole cleared its prefill pod's failure: %+v", st)
	}
	// The pick's charges on the prefill pod end without a completion there (no leg ran).
	if r, n := a.Deps().Drain.PerSecond(prefill), a.Cascade().PrefillInFlight(prefill); r != 0 || n != 0 {
		t.Errorf("the prefill pod after a pair routed whole: drain %v/s, %d prefills in flight; want 0, 0", r, n)
	}
}

// observeFunc is an outcome.Reader.
type observeFunc func(*outcome.Event)

func (f observeFunc) Observe(e *outcome.Event) { f(e) }
