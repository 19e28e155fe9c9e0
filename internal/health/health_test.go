package health

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/testnet"
)

// fixture is a detector over a pool, fed through a real recorder.
type fixture struct {
	t     *testing.T
	clock *load.ManualClock
	store *pool.Store
	rec   *outcome.Recorder
	d     *Detector
	obs   *recordingObserver
	eps   map[string]*pool.Endpoint
}

type recordingObserver struct {
	mu        sync.Mutex
	ejected   []string // key=reason
	returned  []string
	overflows []string
}

func (o *recordingObserver) Ejected(ep *pool.Endpoint, reason string, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ejected = append(o.ejected, ep.Name+"="+reason)
}

func (o *recordingObserver) Returned(ep *pool.Endpoint, _ time.Duration, source string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.returned = append(o.returned, ep.Name+"="+source)
}

func (o *recordingObserver) EjectionOverflow(ep *pool.Endpoint, _, overflow string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.overflows = append(o.overflows, ep.Name+"="+overflow)
}

// podSpec is name:role:roleset (role "" is standard).
type podSpec struct{ name, role, roleset string }

func testConfig() config.Outlier {
	c := config.DefaultOutlier()
	c.BaseEjectionTime, c.MaxEjectionTime, c.Interval = 10*time.Second, 100*time.Second, 5*time.Second
	return c
}

func newFixture(t *testing.T, cfg config.Outlier, pods ...podSpec) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: load.NewManualClock(time.Unix(1_000_000, 0)), store: pool.NewStore(),
		obs: &recordingObserver{}, eps: map[string]*pool.Endpoint{}}
	var eps []*pool.Endpoint
	for i, p := range pods {
		labels := map[string]string{pool.LabelModelName: "m"}
		if p.role != "" {
			labels[pool.LabelRoleName], labels[pool.LabelRolesetName] = p.role, p.roleset
		}
		e := pool.NewEndpoint("ns", p.name, "10.0.0."+strconv.Itoa(i+1), 8000, 0, labels, nil)
		eps = append(eps, e)
		f.eps[p.name] = e
	}
	f.store.Publish(pool.Info{}, eps, true)
	f.rec = outcome.NewRecorder(f.clock)
	f.d = New(Options{Config: cfg, Store: f.store, Clock: f.clock, Observer: f.obs, Recorder: f.rec})
	f.rec.Subscribe(f.d)
	for _, e := range eps {
		// Every pod has served (its first scrape answered): a refusal from now on is a failure.
		f.rec.Probe(outcome.Probe{Endpoint: e.Key(), Source: "scrape"})
	}
	return f
}

// newStartingFixture is newFixture with pods that have not answered anything yet.
func newStartingFixture(t *testing.T, cfg config.Outlier, pods ...podSpec) *fixture {
	t.Helper()
	f := newFixture(t, cfg, pods...)
	f.rec = outcome.NewRecorder(f.clock)
	f.d = New(Options{Config: cfg, Store: f.store, Clock: f.clock, Observer: f.obs, Recorder: f.rec})
	f.rec.Subscribe(f.d)
	return f
}

func (f *fixture) key(name string) string { return f.eps[name].Key() }

// answer routes one whole request to name, which answers status.
func (f *fixture) answer(name string, status int) {
	tr := f.rec.Start(outcome.KindWhole, "", f.key(name), 10)
	tr.Response(status, "")
	tr.End(nil)
}

// unreachable routes one request to name that ends with no response (the gateway could not connect).
func (f *fixture) unreachable(name string) {
	tr := f.rec.Start(outcome.KindWhole, "", f.key(name), 10)
	tr.End(&outcome.Failure{Origin: outcome.OriginGateway, Err: outcome.ErrNoResponse})
}

func (f *fixture) probe(name string, p outcome.Probe) {
	p.Endpoint = f.key(name)
	f.rec.Probe(p)
}

func (f *fixture) ejected(name string) bool { return f.d.Ejected(f.key(name)) }

func TestConsecutive5xxEjects(t *testing.T) {
	f := newFixture(t, testConfig(), podSpec{"a", "", ""}, podSpec{"b", "", ""})
	for range 4 {
		f.answer("a", 500)
	}
	f.answer("a", 200) // a success ends the run
	for i := range 4 {
		f.answer("a", 500)
		if f.ejected("a") {
			t.Fatalf("ejected after %d consecutive 5xx, want 5", i+1)
		}
	}
	f.answer("a", 404) // a 4xx is the request's fault: it ends the run too
	for range 5 {
		f.answer("a", 500)
	}
	if !f.ejected("a") || f.d.Status(f.key("a")).Reason != ReasonConsecutive5xx {
		t.Fatalf("5 consecutive 500s: %+v", f.d.Status(f.key("a")))
	}
	if got := f.d.Status(f.key("a")).Until.Sub(f.clock.Now()); got != 10*time.Second {
		t.Errorf("first ejection lasts %s, want the base ejection time 10s", got)
	}
}

// Gateway failures are counted apart from 5xx: a 500 between two 503s ends the gateway run but
// not the 5xx run.
func TestGatewayFailuresCountedApart(t *testing.T) {
	cfg := testConfig()
	cfg.Consecutive5xx, cfg.ConsecutiveGatewayFailure = 0, 3 // only gateway failures eject
	f := newFixture(t, cfg, podSpec{"a", "", ""}, podSpec{"b", "", ""})
	for range 4 {
		f.answer("a", 503)
		f.answer("a", 500)
	}
	if f.ejected("a") {
		t.Fatal("gateway failures interleaved with 500s ejected the endpoint")
	}
	f.unreachable("a")
	f.answer("a", 502)
	if f.ejected("a") {
		t.Fatal("ejected after 2 gateway failures, want 3")
	}
	f.answer("a", 504)
	if st := f.d.Status(f.key("a")); !st.Ejected || st.Reason != ReasonConsecutiveGatewayFailure {
		t.Fatalf("3 gateway failures (no response, 502, 504): %+v", st)
	}
	// With only 5xx counting, gateway failures count as 5xx (Envoy maps them so).
	cfg.Consecutive5xx, cfg.ConsecutiveGatewayFailure = 3, 0
	f = newFixture(t, cfg, podSpec{"a", "", ""}, podSpec{"b", "", ""})
	f.unreachable("a")
	f.answer("a", 500)
	f.unreachable("a")
	if st := f.d.Status(f.key("a")); !st.Ejected || st.Reason != ReasonConsecutive5xx {
		t.Fatalf("no response, 500, no response with consecutive_5xx=3: %+v", st)
	}
}

// An ejected endpoint returns only when its time has passed AND a scrape or probe succeeded.
func TestReturnNeedsTimeAndProbe(t *testing.T) {
	f := newFixture(t, testConfig(), podSpec{"a", "", ""}, podSpec{"b", "", ""})
	for range 5 {
		f.answer("a", 500)
	}
	f.probe("a", outcome.Probe{Source: "scrape"}) // a good scrape before the time: not enough
	if !f.ejected("a") {
		t.Fatal("returned on a probe before the ejection time passed")
	}
	f.clock.Advance(11 * time.Second) // time alone: not enough
	if !f.ejected("a") {
		t.Fatal("returned on time alone")
	}
	f.probe("a", outcome.Probe{Source: "scrape", Err: errors.New("parse error")})
	if !f.ejected("a") {
		t.Fatal("returned on a failed probe")
	}
	f.probe("a", outcome.Probe{Source: "scrape"})
	if f.ejected("a") {
		t.Fatal("not returned after the ejection time and a good scrape")
	}
	if len(f.obs.returned) != 1 || f.obs.returned[0] != "a=scrape" {
		t.Errorf("returns observed: %v", f.obs.returned)
	}
}

// Each ejection lasts longer: base × ejections, up to the maximum; a returned endpoint whose next
// request fails is ejected again at once; ejections are forgiven while it stays in rotation.
func TestEjectionTimeGrows(t *testing.T) {
	f := newFixture(t, testConfig(), podSpec{"a", "", ""}, podSpec{"b", "", ""})
	back := func() {
		t.Helper()
		f.clock.Set(f.d.Status(f.key("a")).Until)
		f.probe("a", outcome.Probe{Source: "scrape"})
		if f.ejected("a") {
			t.Fatal("did not return")
		}
	}
	for range 5 {
		f.answer("a", 500)
	}
	want := []time.Duration{20 * time.Second, 30 * time.Second}
	for _, w := range want {
		back()
		f.answer("a", 500) // on probation: one failure is enough
		st := f.d.Status(f.key("a"))
		if !st.Ejected || st.Reason != ReasonFailedAfterReturn {
			t.Fatalf("a failure right after returning: %+v", st)
		}
		if got := st.Until.Sub(f.clock.Now()); got != w {
			t.Fatalf("ejection %d lasts %s, want %s", st.Ejections, got, w)
		}
	}
	// The maximum caps it.
	for range 10 {
		back()
		f.answer("a", 500)
	}
	if got := f.d.Status(f.key("a")).Until.Sub(f.clock.Now()); got != 100*time.Second {
		t.Fatalf("ejection lasts %s, want the maximum 100s", got)
	}
	// In rotation and succeeding for 3 intervals: 3 ejections forgiven.
	back()
	f.answer("a", 200)
	before := f.d.Status(f.key("a")).Ejections
	f.clock.Advance(3*5*time.Second + time.Millisecond)
	for range 5 {
		f.answer("a", 500)
	}
	st := f.d.Status(f.key("a"))
	if st.Ejections != before-3+1 {
		t.Fatalf("after 3 good intervals the multiplier is %d, want %d-3+1", st.Ejections, before)
	}
}

// A maximum below the base ejection time takes the base, as Envoy's max_ejection_time does:
// Tandem accepts the pair rather than refusing to start.
func TestMaxEjectionTimeBelowBase(t *testing.T) {
	cfg := testConfig()
	cfg.MaxEjectionTime = time.Second // base is 10s
	f := newFixture(t, cfg, podSpec{"a", "", ""}, podSpec{"b", "", ""})
	for range 5 {
		f.answer("a", 500)
	}
	if got := f.d.Status(f.key("a")).Until.Sub(f.clock.Now()); got != 10*time.Second {
		t.Fatalf("ejection lasts %s, want the base 10s", got)
	}
}

// A refused connection on the serving port ejects at once; on another port (a metrics port) it
// says nothing about where requests go. A scrape timeout is a gateway failure.
func TestRefusedServingPortEjectsAtOnce(t *testing.T) {
	cfg := testConfig()
	cfg.ConsecutiveGatewayFailure = 2
	f := newFixture(t, cfg, podSpec{"a", "", ""}, podSpec{"b", "", ""}, podSpec{"c", "", ""})
	f.probe("b", outcome.Probe{Source: "scrape", Err: errors.New("refused"), Refused: true})
	if f.ejected("b") {
		t.Fatal("a refused metrics port ejected the endpoint")
	}
	f.probe("a", outcome.Probe{Source: "scrape", Err: errors.New("refused"), Refused: true, ServingPort: true})
	if st := f.d.Status(f.key("a")); !st.Ejected || st.Reason != ReasonRefused {
		t.Fatalf("refused serving port: %+v", st)
	}
	f.probe("c", outcome.Probe{Source: "scrape", Err: errors.New("timeout"), Timeout: true})
	f.probe("c", outcome.Probe{Source: "scrape", Err: errors.New("timeout"), Timeout: true})
	if st := f.d.Status(f.key("c")); st.Ejected {
		t.Fatalf("the cap (one of three at 50%%) should keep c: %+v", st)
	}
	if len(f.obs.overflows) == 0 {
		t.Fatal("the refused ejection of c was not reported as an overflow")
	}
}

// An endpoint whose serving port refuses before it ever answered (Tandem started before the
// engine) is out of rotation only until it answers: its first successful scrape returns it, with
// no ejection counted and no probation. Once it has answered, a refusal ejects it for the
// ejection time as before.
func TestNotServingYetReturnsOnFirstAnswer(t *testing.T) {
	cfg := testConfig()
	cfg.MaxEjectionPercent = 100
	f := newStartingFixture(t, cfg, podSpec{"a", "", ""}, podSpec{"b", "", ""}, podSpec{"c", "", ""})
	refuse := outcome.Probe{Source: "scrape", Err: errors.New("refused"), Refused: true, ServingPort: true}
	f.probe("a", refuse)
	st := f.d.Status(f.key("a"))
	if !st.Ejected || st.Reason != ReasonNotServingYet || st.Ejections != 0 {
		t.Fatalf("a starting pod that refuses: %+v, want out of rotation as not_serving_yet with no ejection counted", st)
	}
	f.clock.Advance(time.Second)
	f.probe("a", outcome.Probe{Source: "scrape"}) // the engine is up
	if st := f.d.Status(f.key("a")); st.Ejected || st.Probation {
		t.Fatalf("its first answer did not return it (or put it on probation): %+v", st)
	}
	if len(f.obs.returned) != 0 {
		t.Errorf("a pod that started late was counted as returned from an ejection: %v", f.obs.returned)
	}
	f.answer("a", 500) // one failure after starting is one failure, not an ejection
	if f.ejected("a") {
		t.Fatal("a pod that started late was ejected by its first failure")
	}
	f.answer("a", 200)
	f.probe("a", refuse) // it answered before: now a refusal is an ejection for the ejection time
	st = f.d.Status(f.key("a"))
	if !st.Ejected || st.Reason != ReasonRefused || st.Ejections != 1 || st.Until.Sub(f.clock.Now()) != cfg.BaseEjectionTime {
		t.Fatalf("a pod that had served and then refused: %+v", st)
	}
	f.probe("a", outcome.Probe{Source: "scrape"})
	if !f.ejected("a") {
		t.Fatal("a served-then-refused pod returned before its ejection time")
	}
	// Requests that find no listener before any scrape did (five gateway failures) hold a
	// starting pod out the same way: it returns with its first answer.
	for range 5 {
		f.unreachable("c")
	}
	if st := f.d.Status(f.key("c")); !st.Ejected || st.Reason != ReasonNotServingYet || st.Ejections != 0 {
		t.Fatalf("a starting pod that requests could not reach: %+v, want not_serving_yet", st)
	}
	f.probe("c", outcome.Probe{Source: "scrape"})
	if f.ejected("c") {
		t.Fatal("c did not return with its first answer")
	}
	// A request success also counts as answering.
	f.answer("b", 200)
	f.probe("b", refuse)
	if st := f.d.Status(f.key("b")); st.Reason != ReasonRefused {
		t.Fatalf("b answered a request, then refused: reason %q, want %q", st.Reason, ReasonRefused)
	}
}

// The cap: at most max_ejection_percent of a model's role group (prefill; decode + standard),
// at least one, and never the last way to serve the model.
func TestCapNeverEjectsEverything(t *testing.T) {
	refuse := func(f *fixture, name string) {
		f.probe(name, outcome.Probe{Source: "scrape", Err: errors.New("refused"), Refused: true, ServingPort: true})
	}
	cases := []struct {
		name    string
		pods    []podSpec
		kill    []string
		ejected []string
		kept    []string
	}{
		{"two rolesets, both decode pods dead: one stays",
			[]podSpec{{"pa", "prefill", "a"}, {"da", "decode", "a"}, {"pb", "prefill", "b"}, {"db", "decode", "b"}},
			[]string{"db", "da"}, []string{"db"}, []string{"da"}},
		{"one roleset and two standard pods: every decode pod may go",
			[]podSpec{{"pa", "prefill", "a"}, {"d1", "decode", "a"}, {"d2", "decode", "a"}, {"s1", "", ""}, {"s2", "", ""}},
			[]string{"d1", "d2", "s1"}, []string{"d1", "d2"}, []string{"s1"}},
		{"prefill of one roleset and decode of the other would leave no pair",
			[]podSpec{{"pa", "prefill", "a"}, {"da", "decode", "a"}, {"pb", "prefill", "b"}, {"db", "decode", "b"}},
			[]string{"pa", "db"}, []string{"pa"}, []string{"db"}},
		{"a single standard pod is never ejected",
			[]podSpec{{"s", "", ""}}, []string{"s"}, nil, []string{"s"}},
		{"pods without roleset labels (llm-d's) pair any prefill with any decode pod: one decode pod may go",
			[]podSpec{{"p1", "prefill", ""}, {"p2", "prefill", ""}, {"d1", "decode", ""}, {"d2", "decode", ""}},
			[]string{"d1", "d2"}, []string{"d1"}, []string{"d2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, testConfig(), c.pods...)
			for _, n := range c.kill {
				refuse(f, n)
			}
			for _, n := range c.ejected {
				if !f.ejected(n) {
					t.Errorf("%s not ejected", n)
				}
			}
			for _, n := range c.kept {
				if f.ejected(n) {
					t.Errorf("%s ejected: the cap should have kept it", n)
				}
			}
			if len(c.kept) > 0 && len(f.obs.overflows) == 0 {
				t.Error("no overflow reported")
			}
		})
	}
}

// A route served by a fallback tells that the gateway could not reach the destinations before it.
func TestFallbackServedBlamesSkippedDestinations(t *testing.T) {
	cfg := testConfig()
	cfg.ConsecutiveGatewayFailure = 2
	f := newFixture(t, cfg, podSpec{"a", "", ""}, podSpec{"b", "", ""}, podSpec{"c", "", ""}, podSpec{"d", "", ""})
	for range 2 {
		tr := f.rec.Start(outcome.KindWhole, "", f.key("a"), 10)
		tr.Fallbacks(f.key("b"), f.key("c"))
		tr.Response(200, f.key("c"))
		tr.End(nil)
	}
	if !f.ejected("a") || !f.ejected("b") {
		t.Errorf("the destinations the gateway skipped twice are not ejected: a %+v, b %+v", f.d.Status(f.key("a")), f.d.Status(f.key("b")))
	}
	if f.d.Status(f.key("c")).RecentFailure {
		t.Error("the fallback that served is blamed")
	}
}

// A prefill leg's failure counts against the prefill pod: transport errors and 5xx do, a 4xx
// (the request's fault) and a cancelled leg do not. A client that left blames nobody.
func TestPrefillLegAndCallerErrors(t *testing.T) {
	cfg := testConfig()
	cfg.Consecutive5xx, cfg.ConsecutiveGatewayFailure = 2, 2
	f := newFixture(t, cfg, podSpec{"pa", "prefill", "a"}, podSpec{"da", "decode", "a"},
		podSpec{"pb", "prefill", "b"}, podSpec{"db", "decode", "b"})
	leg := func(err error) {
		tr := f.rec.Start(outcome.KindPD, f.key("pa"), f.key("da"), 10)
		tr.PrefillEnd(err, true)
		tr.End(err)
	}
	leg(&outcome.Failure{Origin: outcome.OriginUpstream, Status: 400})
	leg(context.Canceled)
	leg(&outcome.Failure{Origin: outcome.OriginCaller, Err: context.Canceled})
	if st := f.d.Status(f.key("pa")); st.Consecutive5xx != 0 || st.ConsGateway != 0 {
		t.Fatalf("4xx and cancelled legs counted: %+v", st)
	}
	leg(&outcome.Failure{Origin: outcome.OriginGateway, Err: errors.New("connection refused")})
	leg(&outcome.Failure{Origin: outcome.OriginUpstream, Status: 503})
	if !f.ejected("pa") {
		t.Fatalf("two failed prefill legs: %+v", f.d.Status(f.key("pa")))
	}
	if st := f.d.Status(f.key("da")); st.Consecutive5xx != 0 || st.RecentFailure {
		t.Errorf("the decode pod is blamed for its prefill pod: %+v", st)
	}
	// A pair routed whole ran no leg: its decode pod's failure before any answer is the decode
	// pod's (the record is the pair's, its leg ErrPrefillNotRun).
	whole := f.rec.Start(outcome.KindPD, f.key("pb"), f.key("db"), 10)
	whole.PrefillEnd(outcome.ErrPrefillNotRun, false)
	whole.End(&outcome.Failure{Origin: outcome.OriginGateway, Err: errors.New("connection refused")})
	if st := f.d.Status(f.key("db")); st.ConsGateway != 1 {
		t.Errorf("a pair routed whole whose decode pod refused: decode pod %+v, want one gateway failure", st)
	}
	if st := f.d.Status(f.key("pb")); st.RecentFailure || st.ConsGateway != 0 {
		t.Errorf("a pair routed whole blamed its prefill pod: %+v", st)
	}
	// An inferred prefill end (sidecar) says nothing.
	tr := f.rec.Start(outcome.KindPD, f.key("pb"), f.key("db"), 10)
	tr.PrefillEnd(errors.New("x"), false)
	tr.End(&outcome.Failure{Origin: outcome.OriginCaller})
	if st := f.d.Status(f.key("pb")); st.RecentFailure || st.ConsGateway != 0 {
		t.Errorf("an inferred prefill end counted: %+v", st)
	}
}

// Partition: ejected endpoints are never usable, recently failed ones are usable but not
// healthy, and the usual case returns the candidates untouched.
func TestPartition(t *testing.T) {
	f := newFixture(t, testConfig(), podSpec{"a", "", ""}, podSpec{"b", "", ""}, podSpec{"c", "", ""}, podSpec{"d", "", ""})
	cands := []*pool.Endpoint{f.eps["a"], f.eps["b"], f.eps["c"], f.eps["d"]}
	h, u, x := f.d.Partition(cands)
	if &h[0] != &cands[0] || &u[0] != &cands[0] || x != nil {
		t.Fatal("nothing troubled: the candidates should come back as they are")
	}
	f.probe("b", outcome.Probe{Err: errors.New("refused"), Refused: true, ServingPort: true})
	f.answer("c", 500)
	h, u, x = f.d.Partition(cands)
	names := func(eps []*pool.Endpoint) (out []string) {
		for _, e := range eps {
			out = append(out, e.Name)
		}
		return out
	}
	if got := names(h); len(got) != 2 || got[0] != "a" || got[1] != "d" {
		t.Errorf("healthy %v, want [a d]", got)
	}
	if got := names(u); len(got) != 3 || got[0] != "a" || got[1] != "c" || got[2] != "d" {
		t.Errorf("usable %v, want [a c d]", got)
	}
	if len(x) != 2 || x[0].Endpoint.Name != "b" || x[0].State != StateEjected || x[0].Reason != ReasonRefused ||
		x[1].Endpoint.Name != "c" || x[1].State != StateRecentFailure {
		t.Errorf("excluded %+v", x)
	}
	f.clock.Advance(3 * time.Second) // past the 2 s recent-failure window
	if h, _, _ = f.d.Partition(cands); len(h) != 3 {
		t.Errorf("a failure 3 s old still demotes: healthy %v", names(h))
	}
	f.answer("c", 200)
	f.answer("c", 500)
	f.answer("c", 200) // a success clears it at once
	if h, _, _ = f.d.Partition(cands); len(h) != 3 {
		t.Errorf("a success did not clear the failure: healthy %v", names(h))
	}
}

func TestOnEjectNotifies(t *testing.T) {
	f := newFixture(t, testConfig(), podSpec{"a", "", ""}, podSpec{"b", "", ""})
	fired := 0
	stop := f.d.OnEject(f.key("a"), func() { fired++ })
	f.probe("a", outcome.Probe{Err: errors.New("refused"), Refused: true, ServingPort: true})
	stop()
	if fired != 1 {
		t.Fatalf("watcher fired %d times", fired)
	}
	if f.d.OnEject(f.key("a"), func() { fired++ }); fired != 2 {
		t.Fatal("a watcher of an endpoint already ejected is not told at once")
	}
}

// The health probe: an ejected endpoint past its time, whose scrapes do not succeed, returns
// once GET /health answers 2xx on its serving port (real HTTP server); a closed port keeps it out.
func TestHealthProbeReturnsEndpoint(t *testing.T) {
	var mu sync.Mutex
	status := http.StatusServiceUnavailable
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != ProbePath {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	dp := testnet.RefusedPort(t)

	clock := load.NewManualClock(time.Unix(1_000_000, 0))
	store := pool.NewStore()
	live := pool.NewEndpoint("ns", "live", host, int32(p), 0, nil, nil)
	dead := pool.NewEndpoint("ns", "dead", "127.0.0.1", int32(dp), 0, nil, nil)
	other := pool.NewEndpoint("ns", "other", "127.0.0.2", 9, 0, nil, nil)
	store.Publish(pool.Info{}, []*pool.Endpoint{live, dead, other}, true)
	cfg := testConfig()
	cfg.MaxEjectionPercent = 100
	rec := outcome.NewRecorder(clock) // as the app wires it: the probes go through the recorder
	d := New(Options{Config: cfg, Store: store, Clock: clock, Recorder: rec})
	rec.Subscribe(d)
	probed := probeSignal(make(chan string, 16))
	rec.Subscribe(probed) // after d: a probe is signalled once d has read it
	for _, e := range []*pool.Endpoint{live, dead} {
		d.Observe(&outcome.Event{Phase: outcome.PhaseProbe, Probe: &outcome.Probe{Endpoint: e.Key(), Source: "scrape"}}) // it served
		d.Observe(&outcome.Event{Phase: outcome.PhaseProbe, Probe: &outcome.Probe{Endpoint: e.Key(), Err: errors.New("refused"),
			Refused: true, ServingPort: true}})
	}
	if !d.Ejected(live.Key()) || !d.Ejected(dead.Key()) {
		t.Fatal("setup: both should be ejected")
	}
	// sweepAndWait sweeps and waits until the detector has read the health probe of each of keys.
	sweepAndWait := func(keys ...string) {
		t.Helper()
		d.sweep(context.Background())
		timeout := time.After(5 * time.Second)
		for len(keys) > 0 {
			select {
			case k := <-probed:
				keys = slices.DeleteFunc(keys, func(w string) bool { return w == k })
			case <-timeout:
				t.Fatalf("no health probe of %v within 5s", keys)
			}
		}
	}
	sweepAndWait() // before the ejection time: nothing is probed
	clock.Advance(11 * time.Second)
	sweepAndWait(live.Key(), dead.Key()) // /health answers 503: not yet
	if !d.Ejected(live.Key()) {
		t.Fatal("returned on a 503 health probe")
	}
	mu.Lock()
	status = http.StatusOK
	mu.Unlock()
	sweepAndWait(live.Key())
	if d.Ejected(live.Key()) {
		t.Error("a 200 health probe after the ejection time did not return the endpoint")
	}
	if !d.Ejected(dead.Key()) {
		t.Error("an endpoint refusing its probe returned")
	}
}

// probeSignal receives the endpoint key of every health probe its recorder publishes.
type probeSignal chan string

func (s probeSignal) Observe(e *outcome.Event) {
	if e.Phase == outcome.PhaseProbe && e.Probe.Source == SourceHealthProbe {
		s <- e.Probe.Endpoint
	}
}

// Failing fast is not idleness, and failing again and again less so: each consecutive failure
// lengthens the demotion by one recent-failure window (2 s by default), up to the longest
// ejection; a success ends it.
func TestDemotionGrowsWithConsecutiveFailures(t *testing.T) {
	cfg := testConfig()
	cfg.Consecutive5xx, cfg.ConsecutiveGatewayFailure = 100, 100 // never eject here
	f := newFixture(t, cfg, podSpec{"a", "", ""}, podSpec{"b", "", ""})
	demoted := func() bool { return f.d.RecentFailure(f.key("a")) }
	for k := 1; k <= 3; k++ {
		f.answer("a", 500)
		f.clock.Advance(time.Duration(k)*2*time.Second - time.Millisecond)
		if !demoted() {
			t.Fatalf("after %d consecutive failures, not demoted for %d×2s", k, k)
		}
		f.clock.Advance(2 * time.Millisecond)
		if demoted() {
			t.Fatalf("after %d consecutive failures, still demoted past %d×2s", k, k)
		}
	}
	for range 200 {
		f.answer("a", 503)
	}
	f.clock.Advance(99 * time.Second)
	if !demoted() {
		t.Fatal("the demotion is capped at the longest ejection (100s), not shorter")
	}
	f.clock.Advance(2 * time.Second)
	if demoted() {
		t.Fatal("the demotion outlasts the longest ejection")
	}
	f.answer("a", 503)
	f.answer("a", 200)
	if demoted() {
		t.Fatal("a success did not end the demotion")
	}
}

// A pod held out because it never served (not_serving_yet) takes no slot of the cap: the cap
// keeps serving capacity, and a pod that never answered is none. A sick pod that served is
// still ejected beside it, and a second never-started pod is held out even with the cap full.
func TestNotServingYetTakesNoCapSlot(t *testing.T) {
	cfg := testConfig()
	cfg.MaxEjectionPercent = 50
	f := newStartingFixture(t, cfg, podSpec{"a", "", ""}, podSpec{"b", "", ""}, podSpec{"c", "", ""},
		podSpec{"d", "", ""}, podSpec{"e", "", ""}, podSpec{"f", "", ""})
	for _, n := range []string{"b", "c", "d", "e"} {
		f.probe(n, outcome.Probe{Source: "scrape"}) // these engines are up; a and f never start
	}
	refuse := outcome.Probe{Source: "scrape", Err: errors.New("refused"), Refused: true, ServingPort: true}
	f.probe("a", refuse)
	if st := f.d.Status(f.key("a")); st.Reason != ReasonNotServingYet {
		t.Fatalf("a: %+v, want not_serving_yet", st)
	}
	// Of the five pods that may serve (b–f), 50 % is two: b and c, both sick, are ejected.
	f.probe("b", refuse)
	f.probe("c", refuse)
	for _, n := range []string{"b", "c"} {
		if st := f.d.Status(f.key(n)); !st.Ejected || st.Reason != ReasonRefused {
			t.Errorf("%s served, then refused: %+v, want ejected (a, which never served, takes no cap slot)", n, st)
		}
	}
	if len(f.obs.overflows) != 0 {
		t.Errorf("overflows %v, want none", f.obs.overflows)
	}
	// The cap is full: d is kept in rotation, but f, which never served, is still held out.
	f.probe("d", refuse)
	if f.ejected("d") {
		t.Error("d was ejected beyond the cap (b and c are out)")
	}
	f.probe("f", refuse)
	if st := f.d.Status(f.key("f")); !st.Ejected || st.Reason != ReasonNotServingYet {
		t.Errorf("f never served and refuses: %+v, want held out as not_serving_yet with the cap full", st)
	}
}

// A refused probe that started before a success of another prober was recorded (a scrape and a
// health probe racing) is older news than the success: it ejects nothing. A refusal that
// started after the success is a refusal.
func TestRefusalOlderThanASuccessIsIgnored(t *testing.T) {
	f := newFixture(t, testConfig(), podSpec{"a", "", ""}, podSpec{"b", "", ""}, podSpec{"c", "", ""})
	refused := func(took time.Duration) outcome.Probe {
		return outcome.Probe{Source: "health_probe", Err: errors.New("refused"), Refused: true, ServingPort: true, Took: took}
	}
	// The health probe starts at t; the scrape's success is recorded at t + 50 ms; the probe's
	// refusal at t + 100 ms.
	f.clock.Advance(50 * time.Millisecond)
	f.probe("a", outcome.Probe{Source: "scrape"})
	f.clock.Advance(50 * time.Millisecond)
	f.probe("a", refused(100*time.Millisecond))
	if st := f.d.Status(f.key("a")); st.Ejected || st.RecentFailure {
		t.Fatalf("a refusal that started before a recorded success: %+v, want nothing counted", st)
	}
	f.probe("a", refused(10*time.Millisecond)) // started 40 ms after the success
	if st := f.d.Status(f.key("a")); !st.Ejected || st.Reason != ReasonRefused {
		t.Fatalf("a refusal that started after the success: %+v, want ejected", st)
	}
}

// Without a recorder the detector reads its own health probes directly: an ejected endpoint
// past its time returns on a 200 from GET /health.
func TestHealthProbeWithoutRecorder(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != ProbePath {
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	clock := load.NewManualClock(time.Unix(1_000_000, 0))
	store := pool.NewStore()
	live := pool.NewEndpoint("ns", "live", host, int32(p), 0, nil, nil)
	other := pool.NewEndpoint("ns", "other", "127.0.0.2", 9, 0, nil, nil)
	store.Publish(pool.Info{}, []*pool.Endpoint{live, other}, true)
	cfg := testConfig()
	cfg.MaxEjectionPercent = 100
	d := New(Options{Config: cfg, Store: store, Clock: clock})
	d.Observe(&outcome.Event{Phase: outcome.PhaseProbe, Probe: &outcome.Probe{Endpoint: live.Key(), Source: "scrape"}})
	d.Observe(&outcome.Event{Phase: outcome.PhaseProbe, Probe: &outcome.Probe{Endpoint: live.Key(), Err: errors.New("refused"),
		Refused: true, ServingPort: true}})
	if !d.Ejected(live.Key()) {
		t.Fatal("setup: live should be ejected")
	}
	clock.Advance(11 * time.Second)
	d.sweep(context.Background())
	for deadline := time.Now().Add(5 * time.Second); d.Ejected(live.Key()); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a 200 health probe after the ejection time did not return the endpoint within 5 s")
		}
	}
}
