package extproc

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/gateway"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

func TestDestinationOnlyClientDetected(t *testing.T) {
	v := func(k, val string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: val} }
	raw := func(k, val string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(val)} }
	for _, tc := range []struct {
		name string
		hs   []*corev3.HeaderValue
		want bool
	}{
		{"NGINX Gateway Fabric's shim: values in value, no pseudo-headers", []*corev3.HeaderValue{v("content-type", "application/json"), v("x-epp-host", "10.0.0.9")}, true},
		{"Envoy: pseudo-headers, raw_value", []*corev3.HeaderValue{raw(":path", "/v1/completions"), raw(":method", "POST"), raw("content-type", "application/json")}, false},
		{"values in value but a :path", []*corev3.HeaderValue{v(":path", "/v1/completions"), v("content-type", "application/json")}, false},
		{"no pseudo-headers but raw_value", []*corev3.HeaderValue{raw("content-type", "application/json")}, false},
		{"a mix of value and raw_value", []*corev3.HeaderValue{v("a", "1"), raw("b", "2")}, false},
		{"no headers at all", nil, false},
	} {
		if got := destinationOnlyClient(tc.hs); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// threePods is a pool of three standard pods.
func threePods() *pool.Store {
	s := pool.NewStore()
	s.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{
		pool.NewEndpoint("ns", "a", "10.0.0.1", 8000, 0, nil, nil),
		pool.NewEndpoint("ns", "b", "10.0.0.2", 8000, 0, nil, nil),
		pool.NewEndpoint("ns", "c", "10.0.0.3", 8000, 0, nil, nil),
	}, true)
	return s
}

// serveShim runs srv on 127.0.0.1 and returns the URL of an NGINX Gateway Fabric shim in front
// of it (gateway.Shim, plaintext) and an Envoy-like client to the same server.
func serveShim(t *testing.T, srv *Server) (shim string, c *envoy.Client) {
	t.Helper()
	addr, c := serveAt(t, srv)
	hs := httptest.NewServer(&gateway.Shim{Plaintext: true})
	t.Cleanup(hs.Close)
	host, port, _ := net.SplitHostPort(addr)
	return hs.URL + "?host=" + host + "&port=" + port, c
}

// askShim posts body to the shim as NGF's njs module does and returns its status and destination.
func askShim(t *testing.T, shim, body string) (int, string) {
	t.Helper()
	url, query, _ := strings.Cut(shim, "?")
	params := map[string]string{}
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		params[k] = v
	}
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(gateway.HeaderEPPHost, params["host"])
	req.Header.Set(gateway.HeaderEPPPort, params["port"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(wire.HeaderDestination)
}

// TestDestinationAnswerPerClient: a client that takes one host:port (detected, or configured)
// gets the primary alone; every other client keeps the ranked fallbacks; the settings override
// the detection either way; the header and the envoy.lb metadata always carry the same value.
func TestDestinationAnswerPerClient(t *testing.T) {
	all := "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"
	ranked := func() *stubScheduler {
		return &stubScheduler{decide: func(_ *request.Request, cands []*pool.Endpoint) (*picker.Decision, error) {
			return &picker.Decision{Strategy: "stub", Outcome: picker.OutcomeSingle, Step: "all", Destination: cands,
				Trace: &picker.Trace{}}, nil
		}}
	}
	for _, tc := range []struct {
		name                 string
		opts                 Options
		wantNGINX, wantEnvoy string
	}{
		{"defaults: detected", Options{}, "10.0.0.1:8000", all},
		{"fallbacks on", Options{Fallbacks: config.FallbacksOn}, all, all},
		{"fallbacks off", Options{Fallbacks: config.FallbacksOff}, "10.0.0.1:8000", "10.0.0.1:8000"},
		{"every client full", Options{Client: config.ClientFull}, all, all},
		{"every client destination-only", Options{Client: config.ClientDestinationOnly}, "10.0.0.1:8000", "10.0.0.1:8000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shim, c := serveShim(t, NewServer(threePods(), ranked(), tc.opts))
			if code, dest := askShim(t, shim, chatBody); code != 200 || dest != tc.wantNGINX {
				t.Errorf("NGINX shim: %d %q, want 200 %q", code, dest, tc.wantNGINX)
			}
			req := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)}
			_, r, err := c.Route(testCtx(t), req)
			if err != nil || r.Immediate != nil {
				t.Fatalf("envoy: %v %+v", err, r)
			}
			// envoy.Client fails the route when header and metadata differ; check the value too.
			if got := strings.Join(r.Endpoints(), ","); got != tc.wantEnvoy {
				t.Errorf("envoy: destination %q, want %q", got, tc.wantEnvoy)
			}
		})
	}
}

// prefillRec is a PD lifecycle that records PrefillDone and Done with their times.
type prefillRec struct {
	recLifecycle
	mu          sync.Mutex
	prefillDone []error
	doneAt      time.Time
}

func (l *prefillRec) PrefillDone(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prefillDone = append(l.prefillDone, err)
}

func (l *prefillRec) Done(err error) {
	l.mu.Lock()
	l.doneAt = time.Now()
	l.mu.Unlock()
	l.recLifecycle.Done(err)
}

// TestPDRoutedWholeForDestinationOnlyClients: whatever the hand-off mode, a PD decision for a
// client that honours only the destination header goes whole to the decode pod: no prefill
// leg runs (no adapters are even consulted), no prefill target is named, the prefill pod's
// charges end at once, and the trace says why. The same decision for Envoy keeps its hand-off.
func TestPDRoutedWholeForDestinationOnlyClients(t *testing.T) {
	for _, mode := range []string{config.HandoffAuto, config.HandoffSidecar, config.HandoffEPP} {
		t.Run(mode, func(t *testing.T) {
			lc := &prefillRec{}
			var got *picker.Decision
			sched := pdPair(lc, mode)
			inner := sched.decide
			sched.decide = func(req *request.Request, cands []*pool.Endpoint) (*picker.Decision, error) {
				d, err := inner(req, cands)
				got = d
				return d, err
			}
			obs := newRecObserver()
			shim, _ := serveShim(t, NewServer(twoPods(), sched, Options{Observer: obs}))
			code, dest := askShim(t, shim, chatBody)
			if code != 200 || dest != "10.0.0.2:8000" {
				t.Fatalf("shim: %d %q, want the decode pod alone", code, dest)
			}
			obs.waitClosed(t, 1)
			lc.mu.Lock()
			prefillDone := append([]error(nil), lc.prefillDone...)
			lc.mu.Unlock()
			if len(prefillDone) != 1 || prefillDone[0] != nil {
				t.Errorf("PrefillDone calls %v, want one, with nil (the prefill pod released at once)", prefillDone)
			}
			if got.Outcome != picker.OutcomeCombined || !strings.HasSuffix(got.Step, "+"+StepRoutedWhole) ||
				!strings.Contains(strings.Join(got.Trace.Steps, " "), "routed_whole:destination_only_client") || len(got.Prefill) != 0 {
				t.Errorf("decision outcome %s step %s trace %v prefill %v", got.Outcome, got.Step, got.Trace.Steps, got.Prefill)
			}
			obs.mu.Lock()
			ev := obs.decided[0]
			obs.mu.Unlock()
			if ev.Outcome != picker.OutcomeCombined || !strings.HasSuffix(ev.Step, StepRoutedWhole) {
				t.Errorf("observer saw %+v; the metrics must show the request was not disaggregated", ev)
			}
		})
	}
}

// TestDestinationOnlyHold: such a client ends the stream right after the route, so the
// decision stays charged for DestinationOnlyHold and then ends cleanly; with no hold (or for
// an Envoy client, which sends the response phase) it ends with the stream.
func TestDestinationOnlyHold(t *testing.T) {
	const hold = 400 * time.Millisecond
	for _, tc := range []struct {
		name    string
		hold    time.Duration
		wantErr error
	}{
		{"held", hold, nil},
		{"no hold", 0, ErrStreamEnded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := &doneSignal{done: make(chan struct{}, 2)}
			obs := newRecObserver()
			shim, _ := serveShim(t, NewServer(twoPods(), firstWith(lc, nil), Options{Observer: obs, DestinationOnlyHold: tc.hold}))
			start := time.Now()
			if code, _ := askShim(t, shim, chatBody); code != 200 {
				t.Fatalf("shim: %d", code)
			}
			obs.waitClosed(t, 1)
			if _, dones, _ := lc.snapshot(); tc.hold > 0 && dones != 0 && time.Since(start) < tc.hold {
				t.Fatalf("Done called %d times before the hold elapsed", dones)
			}
			select {
			case <-lc.done:
			case <-time.After(10 * time.Second):
				t.Fatal("Done not called within 10s")
			}
			if took := time.Since(start); tc.hold > 0 && took < tc.hold {
				t.Errorf("released after %s, before the %s hold", took, tc.hold)
			}
			if _, dones, err := lc.snapshot(); dones != 1 {
				t.Fatalf("Done called %d times", dones)
			} else if (err == nil) != (tc.wantErr == nil) || !errors.Is(err, tc.wantErr) {
				t.Errorf("Done(%v), want Done(%v)", err, tc.wantErr)
			}
		})
	}
}

// doneSignal is a recLifecycle that also receives on done once per Done, after recording it.
type doneSignal struct {
	recLifecycle
	done chan struct{}
}

func (l *doneSignal) Done(err error) {
	l.recLifecycle.Done(err)
	l.done <- struct{}{}
}
