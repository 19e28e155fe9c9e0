package extproc

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/testnet"
)

// retryObserver counts retry results (and ignores the rest).
type retryObserver struct {
	nopObserver
	mu      sync.Mutex
	results []string
}

func (o *retryObserver) PrefillRetry(result string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.results = append(o.results, result)
}

func (o *retryObserver) got() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.results, ",")
}

// retryRig is the real PD cascade behind the router with passive health, the epp hand-off
// and the ext_proc server, over two rolesets of vLLM pods: prefill-a refuses connections (its
// pod is gone), prefill-b is a real HTTP server answering as vLLM's prefill does (or with
// status, when not 200). The decode pods are never contacted by this client.
type retryRig struct {
	cascade *pd.Cascade
	deps    *picker.Deps
	det     *health.Detector
	rec     *outcome.Recorder
	obs     *retryObserver
	client  *envoy.Client
	eps     map[string]*pool.Endpoint
	prefill int // requests prefill-b received
	mu      sync.Mutex
}

func newRetryRig(t *testing.T, retry config.Retry, prefillStatus int) *retryRig {
	t.Helper()
	return newRetryRigAt(t, retry, prefillStatus, testnet.RefusedAddr(t)) // connections are refused
}

// newRetryRigAt is newRetryRig with prefill-a at addr.
func newRetryRigAt(t *testing.T, retry config.Retry, prefillStatus int, addr string) *retryRig {
	t.Helper()
	return newRetryRigWith(t, retry, prefillStatus, addr, nil)
}

// newRetryRigWith is newRetryRigAt with setup run on the gateway settings and the cascade
// before the router is built (another strategy, policies, latency models).
func newRetryRigWith(t *testing.T, retry config.Retry, prefillStatus int, addr string, setup func(*retryRig, *config.Gateway, *Options)) *retryRig {
	t.Helper()
	rg := &retryRig{obs: &retryObserver{}, eps: map[string]*pool.Endpoint{}}
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		rg.mu.Lock()
		rg.prefill++
		rg.mu.Unlock()
		if prefillStatus != http.StatusOK {
			http.Error(w, `{"error":"overloaded"}`, prefillStatus)
			return
		}
		_, _ = io.WriteString(w, `{"choices":[{"text":"x"}],"kv_transfer_params":{"remote_engine_id":"e-b","remote_block_ids":[1]}}`)
	}))
	t.Cleanup(good.Close)
	_, gonePort, _ := net.SplitHostPort(addr)
	_, goodPort, _ := net.SplitHostPort(good.Listener.Addr().String())
	port := func(s string) int32 { n, _ := strconv.Atoi(s); return int32(n) }
	mk := func(name, ip string, p int32, role, rs string) *pool.Endpoint {
		e := pool.NewEndpoint("ns", name, ip, p, 0, map[string]string{pool.LabelModelName: "m", pool.LabelEngine: pool.EngineVLLM,
			pool.LabelRoleName: role, pool.LabelRolesetName: rs}, nil)
		rg.eps[name] = e
		return e
	}
	store := pool.NewStore()
	store.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{
		mk("prefill-a", "127.0.0.1", port(gonePort), "prefill", "a"), mk("decode-a", "127.0.0.3", 8000, "decode", "a"),
		mk("prefill-b", "127.0.0.1", port(goodPort), "prefill", "b"), mk("decode-b", "127.0.0.4", 8000, "decode", "b"),
	}, true)

	gw := config.DefaultGateway()
	gw.PD.Handoff, gw.DefaultStrategy = config.HandoffEPP, pd.StrategyName
	gw.PD.PrefillScorePolicy, gw.PD.DecodeScorePolicy = pd.PolicyLeastRequest, pd.PolicyLeastRequest
	rg.deps = picker.NewDeps(nil, gw.PD.PrefixCache)
	rg.cascade = pd.New(pd.Options{Deps: rg.deps, Gateway: gw.PD})
	opts := Options{Retry: retry, ResponseHeaderHold: -1}
	if setup != nil {
		setup(rg, &gw, &opts)
	}
	rg.det = health.New(health.Options{Config: config.DefaultOutlier(), Store: store})
	rec := rg.deps.Outcomes // the one record of each request, as the application wires it
	rec.Subscribe(rg.det)
	rg.rec = rec
	res, err := config.NewResolver(gw, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	router, err := picker.NewRouter(picker.RouterOptions{Resolver: res, Strategies: pd.Strategies(rg.cascade, rg.deps, gw.PD), Health: rg.det})
	if err != nil {
		t.Fatal(err)
	}
	adapters, err := handoff.NewAdapters(gw.PD, handoff.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(adapters.Close)
	// Steer the first pick to rs-a: decode-b is busy (the test's own charge, released at the end).
	rg.deps.Running.Start(rg.eps["decode-a"].Key())()
	release := rg.deps.Running.Start(rg.eps["decode-b"].Key())
	t.Cleanup(release)
	opts.Handoff, opts.Outcomes, opts.Health, opts.Observer = adapters, rec, rg.det, rg.obs
	rg.client = serve(t, NewServer(store, router, opts))
	return rg
}

// held is what the PD trackers still count, but for the test's own decode-b charge.
func (rg *retryRig) held(t *testing.T) {
	t.Helper()
	for name, e := range rg.eps {
		k := e.Key()
		running := rg.deps.Running.InFlight(k)
		if name == "decode-b" {
			running--
		}
		if running != 0 || rg.cascade.PrefillInFlight(k) != 0 || rg.cascade.PendingDecode(k) != 0 {
			t.Errorf("%s still counted: running %d, prefill %d, pending %d", name, running, rg.cascade.PrefillInFlight(k), rg.cascade.PendingDecode(k))
		}
	}
}

var retryReq = envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody),
	Headers: envoy.Headers("x-request-id", "r-1")}

// A prefill leg refused by its pod is retried once on another pair: the client gets the second
// pair's route, with the second prefill leg's kv_transfer_params, and no error; the first
// attempt's charges are released, the failed pod is a recent failure for passive health, and the
// retry counts as recovered.
func TestPrefillRetriedOnAnotherPair(t *testing.T) {
	rg := newRetryRig(t, config.DefaultRetry(), http.StatusOK)
	s, routed, err := rg.client.Route(testCtx(t), retryReq)
	if err != nil {
		t.Fatal(err)
	}
	if routed.Immediate != nil {
		t.Fatalf("answered %d %s, want the retried route", routed.Immediate.Status, routed.Immediate.Body)
	}
	if routed.Destination != rg.eps["decode-b"].HostPort() {
		t.Fatalf("destination %q, want decode-b %s", routed.Destination, rg.eps["decode-b"].HostPort())
	}
	if got := gjson.GetBytes(routed.Body, "kv_transfer_params.remote_engine_id").Str; got != "e-b" {
		t.Fatalf("decode body %s: want prefill-b's kv_transfer_params", routed.Body)
	}
	if _, err := s.Respond(envoy.Response{Status: 200, Chunks: [][]byte{[]byte(`{"choices":[]}`)}}); err != nil {
		t.Fatal(err)
	}
	_ = s.CloseSend()
	rg.held(t)
	if got := rg.obs.got(); got != RetryRecovered {
		t.Errorf("retry results %q, want recovered", got)
	}
	if st := rg.det.Status(rg.eps["prefill-a"].Key()); st.ConsGateway != 1 {
		t.Errorf("prefill-a's refused leg did not count as a gateway failure: %+v", st)
	}
	if st := rg.det.Status(rg.eps["decode-a"].Key()); st.ConsGateway != 0 || st.Consecutive5xx != 0 {
		t.Errorf("decode-a was blamed for its prefill pod: %+v", st)
	}
}

// Every attempt failed: one x-error-pd-prefill answer naming both failures; nothing stays charged.
func TestPrefillRetryThatFailsTooIsOneError(t *testing.T) {
	rg := newRetryRig(t, config.DefaultRetry(), http.StatusServiceUnavailable)
	s, routed, err := rg.client.Route(testCtx(t), retryReq)
	if err != nil {
		t.Fatal(err)
	}
	im := routed.Immediate
	if im == nil || im.Status != 503 || im.Headers["x-error-pd-prefill"] != "true" ||
		!strings.Contains(string(im.Body), "http_status") || !strings.Contains(string(im.Body), "the first attempt failed: prefill request failed (transport)") {
		t.Fatalf("answer %+v", im)
	}
	_ = s.CloseSend()
	_, _ = s.Recv()
	rg.held(t)
	if got := rg.obs.got(); got != RetryFailed {
		t.Errorf("retry results %q, want failed", got)
	}
}

// With the budget spent (no floor, no share), the first failure is the answer.
func TestPrefillRetryWithinTheBudget(t *testing.T) {
	rg := newRetryRig(t, config.Retry{PrefillRetry: true, BudgetPercent: 0, MinRetryConcurrency: 0}, http.StatusOK)
	s, routed, err := rg.client.Route(testCtx(t), retryReq)
	if err != nil {
		t.Fatal(err)
	}
	if im := routed.Immediate; im == nil || im.Status != 503 || im.Headers["x-error-pd-prefill"] != "true" || !strings.Contains(string(im.Body), "transport") {
		t.Fatalf("answer %+v, want the first attempt's failure", routed.Immediate)
	}
	_ = s.CloseSend()
	_, _ = s.Recv()
	rg.held(t)
	if got := rg.obs.got(); got != RetryBudgetExhausted {
		t.Errorf("retry results %q", got)
	}
	rg.mu.Lock()
	defer rg.mu.Unlock()
	if rg.prefill != 0 {
		t.Errorf("prefill-b got %d legs without a retry", rg.prefill)
	}
}

func TestRetryBudget(t *testing.T) {
	b := newRetryBudget(config.Retry{PrefillRetry: true, BudgetPercent: 20, MinRetryConcurrency: 2})
	for range 20 {
		b.active.Add(1)
		b.recent.Record(budgetRequests)
	}
	// 20 in flight: 20% is 4 retries at once.
	for i := range 4 {
		if !b.acquire() {
			t.Fatalf("retry %d refused", i+1)
		}
	}
	if b.acquire() {
		t.Fatal("a fifth concurrent retry over 20 requests")
	}
	// Released, but 4 retries over 20 requests in the last minute is the share already.
	for range 4 {
		b.release()
	}
	if b.acquire() {
		t.Fatal("the last minute's share is spent, yet a retry started")
	}
	// Low traffic: the floor (2) still allows retries.
	b = newRetryBudget(config.Retry{PrefillRetry: true, BudgetPercent: 20, MinRetryConcurrency: 2})
	b.active.Add(1)
	b.recent.Record(budgetRequests)
	got := []bool{b.acquire(), b.acquire(), b.acquire()}
	if !got[0] || !got[1] || got[2] {
		t.Fatalf("the floor of 2 retries: %v", got)
	}
}

// A prefill leg in flight to a pod that outlier detection ejects meanwhile (its scrape was
// refused) is cancelled at once and retried on another pair, instead of waiting for the
// prefill timeout (30 s).
func TestPrefillEjectedMidFlightIsRetried(t *testing.T) {
	arrived, cancelled, stop := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	var legs atomic.Int32
	hung := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		legs.Add(1)
		// Read the body: only then does net/http watch the connection and cancel r.Context()
		// when Tandem gives the leg up.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case arrived <- struct{}{}:
		default:
		}
		select { // never answers
		case <-r.Context().Done():
			cancelled <- struct{}{}
		case <-stop:
		}
	}))
	defer hung.Close()
	defer close(stop) // before Close, even when the leg was not cancelled
	rg := newRetryRigAt(t, config.DefaultRetry(), http.StatusOK, hung.Listener.Addr().String())
	go func() {
		<-arrived
		rg.rec.Probe(outcome.Probe{Endpoint: rg.eps["prefill-a"].Key(), Source: "scrape", Err: errors.New("refused"),
			Refused: true, ServingPort: true})
	}()
	start := time.Now()
	s, routed, err := rg.client.Route(testCtx(t), retryReq)
	if err != nil {
		t.Fatal(err)
	}
	if routed.Immediate != nil || routed.Destination != rg.eps["decode-b"].HostPort() {
		t.Fatalf("answer %+v / destination %q, want the retry on decode-b", routed.Immediate, routed.Destination)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the retry waited %s", took)
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Error("the leg to the ejected prefill pod was not cancelled")
	}
	if n := legs.Load(); n != 1 {
		t.Errorf("%d legs reached the ejected pod, want 1", n)
	}
	if _, err := s.Respond(envoy.Response{Status: 200, Chunks: [][]byte{[]byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	_ = s.CloseSend()
	rg.held(t)
	if got := rg.obs.got(); got != RetryRecovered {
		t.Errorf("retry results %q", got)
	}
}
