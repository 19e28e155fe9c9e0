package trt

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

const goodInfo = `{"version":"1.3.0rc8","disaggregated_params":{"ctx_info_endpoint":"tcp://10.0.0.7:5555","ctx_dp_rank":2,"encoded_opaque_state":"AAE="}}`

func TestParseServerInfo(t *testing.T) {
	cases := []struct {
		name, body            string
		endpoint, rank, state string
		errHas                string
	}{
		{name: "full", body: goodInfo, endpoint: `"tcp://10.0.0.7:5555"`, rank: "2", state: `"AAE="`},
		{name: "one-element array, no state", body: `{"disaggregated_params":{"ctx_info_endpoint":["tcp://a:1"],"ctx_dp_rank":0}}`,
			endpoint: `["tcp://a:1"]`, rank: "0"},
		{name: "null state is absent", body: `{"disaggregated_params":{"ctx_info_endpoint":"e","ctx_dp_rank":0,"encoded_opaque_state":null}}`,
			endpoint: `"e"`, rank: "0"},
		{name: "C++ transceiver: empty params", body: `{"disaggregated_params":{}}`, errHas: "ctx_info_endpoint"},
		{name: "no params", body: `{"version":"x"}`, errHas: "disaggregated_params is missing"},
		{name: "empty endpoint", body: `{"disaggregated_params":{"ctx_info_endpoint":"","ctx_dp_rank":0}}`, errHas: "ctx_info_endpoint"},
		{name: "two endpoints", body: `{"disaggregated_params":{"ctx_info_endpoint":["a","b"],"ctx_dp_rank":0}}`, errHas: "lists 2 endpoints"},
		{name: "rank missing", body: `{"disaggregated_params":{"ctx_info_endpoint":"e"}}`, errHas: "ctx_dp_rank"},
		{name: "rank negative", body: `{"disaggregated_params":{"ctx_info_endpoint":"e","ctx_dp_rank":-1}}`, errHas: "ctx_dp_rank"},
		{name: "rank fractional", body: `{"disaggregated_params":{"ctx_info_endpoint":"e","ctx_dp_rank":1.5}}`, errHas: "ctx_dp_rank"},
		{name: "rank as string", body: `{"disaggregated_params":{"ctx_info_endpoint":"e","ctx_dp_rank":"1"}}`, errHas: "ctx_dp_rank"},
		{name: "not JSON", body: `<html>`, errHas: "not valid JSON"},
		// A /server_info body of MaxServerInfoBytes "[" is read by no recursive parser.
		{name: "nested too deep", body: strings.Repeat("[", MaxServerInfoBytes), errHas: "levels deep"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			md, err := ParseServerInfo([]byte(c.body))
			if c.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), c.errHas) {
					t.Fatalf("err = %v, want one containing %q", err, c.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(md.CtxInfoEndpoint) != c.endpoint || string(md.CtxDPRank) != c.rank || string(md.EncodedOpaqueState) != c.state {
				t.Errorf("got %s %s %s, want %s %s %s", md.CtxInfoEndpoint, md.CtxDPRank, md.EncodedOpaqueState, c.endpoint, c.rank, c.state)
			}
		})
	}
}

// infoServer is a context worker whose /server_info answers are scripted by handle.
type infoServer struct {
	*httptest.Server
	hits atomic.Int32
}

func newInfoServer(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, hit int32)) *infoServer {
	t.Helper()
	s := &infoServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handle(w, r, s.hits.Add(1))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *infoServer) endpoint(t *testing.T) *pool.Endpoint {
	host, port, _ := net.SplitHostPort(s.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return pool.NewEndpoint("ns", "ctx-0", host, int32(p), 0, map[string]string{pool.LabelEngine: pool.EngineTRTLLM}, nil)
}

// manualNow is a clock the test moves.
type manualNow struct {
	mu sync.Mutex
	t  time.Time
}

func (m *manualNow) now() time.Time { m.mu.Lock(); defer m.mu.Unlock(); return m.t }
func (m *manualNow) add(d time.Duration) {
	m.mu.Lock()
	m.t = m.t.Add(d)
	m.mu.Unlock()
}

func TestServerInfoCacheTTL(t *testing.T) {
	srv := newInfoServer(t, func(w http.ResponseWriter, _ *http.Request, _ int32) { _, _ = w.Write([]byte(goodInfo)) })
	clock := &manualNow{t: time.Unix(1000, 0)}
	c := NewServerInfoCache(ServerInfoOptions{Now: clock.now})
	ep := srv.endpoint(t)
	steps := []struct {
		advance  time.Duration
		wantHits int32
	}{
		{0, 1},                // first lookup goes to the worker
		{0, 1},                // cached
		{59 * time.Second, 1}, // still within the minute
		{time.Second, 2},      // 60 s: expired, looked up again
		{30 * time.Second, 2}, // cached from the second lookup
	}
	for i, s := range steps {
		clock.add(s.advance)
		md, err := c.Lookup(context.Background(), ep)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if string(md.CtxDPRank) != "2" {
			t.Fatalf("step %d: metadata %+v", i, md)
		}
		if got := srv.hits.Load(); got != s.wantHits {
			t.Fatalf("step %d: %d lookups reached the worker, want %d", i, got, s.wantHits)
		}
	}
}

func TestServerInfoCacheCoalescesConcurrentLookups(t *testing.T) {
	release := make(chan struct{})
	srv := newInfoServer(t, func(w http.ResponseWriter, _ *http.Request, _ int32) {
		<-release
		_, _ = w.Write([]byte(goodInfo))
	})
	c := NewServerInfoCache(ServerInfoOptions{})
	const callers = 16
	joined := make(chan struct{}, callers)
	c.joined = func() { joined <- struct{}{} }
	ep := srv.endpoint(t)
	errs := make(chan error, callers)
	for i := 0; i < callers; i++ {
		go func() {
			md, err := c.Lookup(context.Background(), ep)
			if err == nil && string(md.CtxInfoEndpoint) != `"tcp://10.0.0.7:5555"` {
				err = errors.New("wrong metadata " + string(md.CtxInfoEndpoint))
			}
			errs <- err
		}()
	}
	for i := 0; i < callers; i++ {
		<-joined
	}
	close(release)
	for i := 0; i < callers; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if got := srv.hits.Load(); got != 1 {
		t.Errorf("%d lookups reached the worker, want 1", got)
	}
}

func TestServerInfoCacheTimeoutAndFailuresNotCached(t *testing.T) {
	srv := newInfoServer(t, func(w http.ResponseWriter, r *http.Request, hit int32) {
		switch hit {
		case 1: // hang until the cache gives up
			<-r.Context().Done()
		case 2:
			http.Error(w, "warming up", http.StatusServiceUnavailable)
		case 3:
			http.Redirect(w, r, "http://127.0.0.1:1/elsewhere", http.StatusFound)
		case 4:
			_, _ = w.Write([]byte(`{"disaggregated_params":{"x":"` + strings.Repeat("a", MaxServerInfoBytes) + `"}}`))
		default:
			_, _ = w.Write([]byte(goodInfo))
		}
	})
	// 1 s: long enough for the 1 MiB answer of lookup 4 to be read under -race on a busy
	// machine (100 ms failed there with a deadline instead of "exceeds").
	c := NewServerInfoCache(ServerInfoOptions{Timeout: time.Second})
	ep := srv.endpoint(t)
	for i, want := range []string{"no answer within 1s", "status 503", "status 302", "exceeds", ""} {
		_, err := c.Lookup(context.Background(), ep)
		switch {
		case want == "" && err != nil:
			t.Fatalf("lookup %d: %v", i+1, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Fatalf("lookup %d: err = %v, want one containing %q", i+1, err, want)
		case want != "" && !strings.Contains(err.Error(), "ns/ctx-0"):
			t.Errorf("lookup %d: error %q does not name the pod", i+1, err)
		}
	}
	if got := srv.hits.Load(); got != 5 {
		t.Errorf("%d lookups reached the worker, want 5 (failures are not cached)", got)
	}
}

func TestServerInfoLookupSurvivesAGoneCaller(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := newInfoServer(t, func(w http.ResponseWriter, _ *http.Request, _ int32) {
		close(arrived)
		<-release
		_, _ = w.Write([]byte(goodInfo))
	})
	c := NewServerInfoCache(ServerInfoOptions{})
	ep := srv.endpoint(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.Lookup(ctx, ep); done <- err }()
	<-arrived
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller got %v", err)
	}
	// The shared lookup went on without that caller; the next request joins it.
	joined := make(chan struct{}, 1)
	c.joined = func() { joined <- struct{}{} }
	next := make(chan error, 1)
	go func() { _, err := c.Lookup(context.Background(), ep); next <- err }()
	<-joined
	close(release)
	if err := <-next; err != nil {
		t.Fatal(err)
	}
	if got := srv.hits.Load(); got != 1 {
		t.Errorf("%d lookups reached the worker, want 1", got)
	}
}

func TestServerInfoCacheBounded(t *testing.T) {
	srv := newInfoServer(t, func(w http.ResponseWriter, _ *http.Request, _ int32) { _, _ = w.Write([]byte(goodInfo)) })
	c := NewServerInfoCache(ServerInfoOptions{MaxEntries: 2})
	base := srv.endpoint(t)
	for i := 0; i < 5; i++ {
		ep := pool.NewEndpoint("ns", "ctx-"+strconv.Itoa(i), base.Address, base.Port, 0, base.Labels, nil)
		if _, err := c.Lookup(context.Background(), ep); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	n := len(c.entries)
	c.mu.Unlock()
	if n != 2 {
		t.Errorf("%d entries, want the bound 2", n)
	}
}
