package gateway

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/tandem-epp/tandem/internal/testnet"
)

// upstream is a real HTTP model-server stand-in on 127.0.0.1 that records each request it
// receives whole.
type upstream struct {
	addr    string
	mu      sync.Mutex
	hits    []hit
	respond func(w http.ResponseWriter, r *http.Request)
}

type hit struct {
	path, host string
	header     map[string]string
	body       string
	trailer    map[string]string
}

func startUpstream(t *testing.T, respond func(w http.ResponseWriter, r *http.Request)) *upstream {
	t.Helper()
	u := &upstream{respond: respond}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // the gateway gave up on this request mid-body: not a served request
		}
		u.mu.Lock()
		u.hits = append(u.hits, hit{path: r.URL.RequestURI(), host: r.Host, header: lower(r.Header), body: string(body), trailer: lower(r.Trailer)})
		u.mu.Unlock()
		if u.respond != nil {
			u.respond(w, r)
			return
		}
		w.Header().Set("X-Upstream", u.addr)
		_, _ = io.WriteString(w, "hello from upstream")
	}))
	t.Cleanup(s.Close)
	u.addr = strings.TrimPrefix(s.URL, "http://")
	return u
}

func (u *upstream) got() []hit {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]hit(nil), u.hits...)
}

func startGateway(t *testing.T, opts Options) string {
	t.Helper()
	g, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(g)
	t.Cleanup(func() { s.Close(); g.Close() })
	return s.URL
}

var client = &http.Client{Timeout: 10 * time.Second}

// result is what the client saw; err is set when the body was cut.
type result struct {
	status  int
	header  http.Header
	body    string
	trailer http.Header
	err     error
}

func do(t *testing.T, req *http.Request) result {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, string(b), resp.Trailer, err}
}

func post(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

func TestProxiesThroughEPP(t *testing.T) {
	up := startUpstream(t, nil)
	epp := &scriptedEPP{dest: up.addr, replaceBody: []byte(`{"model":"m","prompt":"rewritten"}`), upperResp: true}
	gw := startGateway(t, Options{EPPAddr: startEPP(t, epp, nil)})

	// 100 000 bytes arrive in several reads, so the EPP must see several chunks.
	original := `{"model":"m","prompt":"` + strings.Repeat("a", 100000-len(`{"model":"m","prompt":""}`)) + `"}`
	req := post(t, gw+"/v1/completions?x=1", original)
	req.Header.Set("X-Secret", "client-token")
	res := do(t, req)

	if res.status != 200 || res.body != "HELLO FROM UPSTREAM" || res.err != nil {
		t.Fatalf("client got %d %q (err %v), want 200 and the upper-cased upstream body", res.status, res.body, res.err)
	}
	if got := res.header.Get("X-Epp-Served"); got != up.addr {
		t.Errorf("response header set by the EPP = %q, want %q", got, up.addr)
	}
	hits := up.got()
	if len(hits) != 1 {
		t.Fatalf("upstream hits = %d, want 1", len(hits))
	}
	h := hits[0]
	if h.body != `{"model":"m","prompt":"rewritten"}` {
		t.Errorf("upstream body = %.60q, want the EPP's replacement", h.body)
	}
	if h.path != "/v1/completions?x=1" || h.header["x-epp"] != "routed" || h.header["x-gateway-destination-endpoint"] != up.addr {
		t.Errorf("upstream saw path %q headers %v", h.path, h.header)
	}
	if _, ok := h.header["x-secret"]; ok {
		t.Errorf("x-secret reached the upstream although the EPP removed it")
	}
	recs := epp.records()
	if len(recs) != 1 {
		t.Fatalf("EPP streams = %d, want 1", len(recs))
	}
	r := recs[0]
	for k, want := range map[string]string{":method": "POST", ":path": "/v1/completions?x=1", ":scheme": "http",
		":authority": strings.TrimPrefix(gw, "http://"), "content-type": "application/json", "x-secret": "client-token"} {
		if r.headers[k] != want {
			t.Errorf("EPP header %s = %q, want %q", k, r.headers[k], want)
		}
	}
	if r.headers["x-request-id"] == "" {
		t.Errorf("EPP got no x-request-id (Envoy generates one)")
	}
	if string(r.body) != original || !r.bodyEOS || r.bodyChunks < 2 || r.headersEOS {
		t.Errorf("EPP body: %d bytes in %d chunks, eos %v, headers eos %v; want %d bytes, ≥2 chunks, eos on the last",
			len(r.body), r.bodyChunks, r.bodyEOS, r.headersEOS, len(original))
	}
	if r.served != up.addr || !r.respEOS {
		t.Errorf("EPP saw served %q (eos %v), want %q", r.served, r.respEOS, up.addr)
	}
}

// TestStreamsEachChunk proves the gateway forwards each SSE event as it comes: the upstream
// sends the next event only after the client has read the previous one, so any buffering on
// the way would deadlock (and the client timeout would fail the test).
func TestStreamsEachChunk(t *testing.T) {
	read := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			_, _ = io.WriteString(w, "data: event"+string(rune('0'+i))+"\n\n")
			_ = http.NewResponseController(w).Flush()
			select {
			case <-read:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	epp := &scriptedEPP{dest: up.addr}
	gw := startGateway(t, Options{EPPAddr: startEPP(t, epp, nil)})

	resp, err := client.Do(post(t, gw+"/v1/chat/completions", `{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var events []string
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after %v: %v", events, err)
		}
		if strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimSpace(line))
			if len(events) <= 3 {
				read <- struct{}{}
			}
		}
	}
	if want := "data: event0,data: event1,data: event2,data: [DONE]"; strings.Join(events, ",") != want {
		t.Fatalf("events = %v, want %s", events, want)
	}
	if r := epp.records(); len(r) != 1 || r[0].respChunks < 4 {
		t.Errorf("EPP saw %+v response chunks, want ≥4 (one per event, then end of stream)", r)
	}
}

func TestFallbacksOnConnectFailure(t *testing.T) {
	up := startUpstream(t, nil)
	dead1, dead2 := testnet.RefusedAddr(t), testnet.RefusedAddr(t)
	cases := []struct {
		name       string
		dest       string
		wantStatus int
		wantServed string
	}{
		{"primary up", up.addr + "," + dead1, 200, up.addr},
		{"primary down, first fallback up", dead1 + "," + up.addr, 200, up.addr},
		{"two down, then up", dead1 + ", " + dead2 + "," + up.addr, 200, up.addr},
		{"all down", dead1 + "," + dead2, 503, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			epp := &scriptedEPP{dest: c.dest}
			gw := startGateway(t, Options{EPPAddr: startEPP(t, epp, nil)})
			res := do(t, post(t, gw+"/v1/completions", `{"prompt":"x"}`))
			if res.status != c.wantStatus {
				t.Fatalf("status %d (%q), want %d", res.status, res.body, c.wantStatus)
			}
			if c.wantServed != "" && res.header.Get("X-Epp-Served") != c.wantServed {
				t.Errorf("served %q, want %q", res.header.Get("X-Epp-Served"), c.wantServed)
			}
			// As Envoy's, the gateway's local reply passes through the EPP's response phase:
			// the EPP learns the request it routed found no endpoint.
			if rec := epp.records(); len(rec) != 1 || rec[0].respStatus != strconv.Itoa(c.wantStatus) {
				t.Errorf("the EPP saw response status %q, want %d", rec[0].respStatus, c.wantStatus)
			}
			if _, applied := res.header["X-Epp-Served"]; !applied {
				t.Error("the EPP's answer to the response headers was not applied")
			}
		})
	}
}

// An endpoint that accepts the request but sends no response headers within UpstreamTimeout
// gets the client a 504, which the EPP sees first (Envoy's route timeout and local reply).
func TestUpstreamTimeoutIsALocalReply(t *testing.T) {
	hung := startUpstream(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	epp := &scriptedEPP{dest: hung.addr}
	gw := startGateway(t, Options{EPPAddr: startEPP(t, epp, nil), UpstreamTimeout: 200 * time.Millisecond})
	start := time.Now()
	res := do(t, post(t, gw+"/v1/completions", `{"prompt":"x"}`))
	if res.status != http.StatusGatewayTimeout || !strings.Contains(res.body, "upstream request timeout") {
		t.Fatalf("status %d %q, want 504 upstream request timeout", res.status, res.body)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("answered after %s", took)
	}
	if rec := epp.records(); len(rec) != 1 || rec[0].respStatus != "504" {
		t.Errorf("the EPP saw %+v, want a 504 response", rec)
	}
}

func TestImmediateResponseAtEachPhase(t *testing.T) {
	cases := []struct {
		phase      string
		get        bool // a body-less GET: the EPP answers the headers at once
		wantStatus int
		wantBody   string
		wantCut    bool
		wantHits   int
	}{
		{phase: "headers", get: true, wantStatus: 429, wantBody: "shed", wantHits: 0},
		{phase: "body", wantStatus: 400, wantBody: `{"error":"bad body"}`, wantHits: 0},
		{phase: "respHeaders", wantStatus: 503, wantBody: "decode pod unhealthy", wantHits: 1},
		{phase: "respBody", wantStatus: 200, wantCut: true, wantHits: 1},
	}
	for _, c := range cases {
		t.Run(c.phase, func(t *testing.T) {
			up := startUpstream(t, nil)
			epp := &scriptedEPP{dest: up.addr, immediateAt: c.phase}
			gw := startGateway(t, Options{EPPAddr: startEPP(t, epp, nil)})
			req := post(t, gw+"/v1/completions", `{"prompt":"x"}`)
			if c.get {
				req, _ = http.NewRequest(http.MethodGet, gw+"/v1/models", nil)
			}
			res := do(t, req)
			if res.status != c.wantStatus {
				t.Fatalf("status %d, want %d", res.status, c.wantStatus)
			}
			if c.wantCut {
				if res.err == nil {
					t.Fatalf("client read %q completely, want a cut stream", res.body)
				}
			} else if res.body != c.wantBody || res.header.Get("X-Epp-Error") != "yes" || res.err != nil {
				t.Errorf("body %q header %q err %v, want %q with the EPP's header", res.body, res.header.Get("X-Epp-Error"), res.err, c.wantBody)
			}
			if n := len(up.got()); n != c.wantHits {
				t.Errorf("upstream hits %d, want %d", n, c.wantHits)
			}
			if c.get && !epp.records()[0].headersEOS {
				t.Errorf("GET without body: request headers must carry end_of_stream")
			}
		})
	}
}

func TestEPPFailures(t *testing.T) {
	cases := []struct {
		name        string
		epp         *scriptedEPP // nil: nothing listens at the EPP address
		failOpen    bool
		wantStatus  int
		wantCut     bool
		wantPrimary int // hits on the EPP's pick
		wantDefault int // hits on the fail-open default
	}{
		{name: "unreachable, fail-closed", wantStatus: 503},
		{name: "unreachable, fail-open", failOpen: true, wantStatus: 200, wantDefault: 1},
		{name: "abort before decision, fail-closed", epp: &scriptedEPP{abortAt: "body"}, wantStatus: 500},
		{name: "abort before decision, fail-open", epp: &scriptedEPP{abortAt: "body"}, failOpen: true, wantStatus: 200, wantDefault: 1},
		{name: "abort after response headers", epp: &scriptedEPP{abortAt: "respBody"}, wantStatus: 200, wantCut: true, wantPrimary: 1},
		{name: "header and metadata disagree", epp: &scriptedEPP{metaDest: "127.0.0.9:1"}, wantStatus: 500},
		{name: "no destination", epp: &scriptedEPP{noDest: true}, wantStatus: 503},
		{name: "plain body answer in full-duplex mode", epp: &scriptedEPP{plainBody: true}, wantStatus: 500},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			primary, fallback := startUpstream(t, nil), startUpstream(t, nil)
			addr := testnet.RefusedAddr(t)
			if c.epp != nil {
				c.epp.dest = primary.addr
				addr = startEPP(t, c.epp, nil)
			}
			gw := startGateway(t, Options{EPPAddr: addr, FailOpen: c.failOpen, DefaultEndpoints: []string{testnet.RefusedAddr(t), fallback.addr}})
			res := do(t, post(t, gw+"/v1/completions", `{"prompt":"original"}`))
			if res.status != c.wantStatus || (res.err != nil) != c.wantCut {
				t.Fatalf("status %d cut %v (%q), want %d cut %v", res.status, res.err != nil, res.body, c.wantStatus, c.wantCut)
			}
			if p, d := len(primary.got()), len(fallback.got()); p != c.wantPrimary || d != c.wantDefault {
				t.Fatalf("hits: EPP's pick %d, default %d; want %d, %d", p, d, c.wantPrimary, c.wantDefault)
			}
			if c.wantDefault == 1 && fallback.got()[0].body != `{"prompt":"original"}` {
				t.Errorf("fail-open sent %q upstream, want the client's body", fallback.got()[0].body)
			}
		})
	}
}

// TestTrailers: client trailers reach the EPP as a trailers message and go upstream with the
// EPP's mutation; upstream trailers come back the same way.
func TestTrailers(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Up-Trailer")
		_, _ = io.WriteString(w, "body")
		w.Header().Set("X-Up-Trailer", "done")
	})
	epp := &scriptedEPP{dest: up.addr}
	gw := startGateway(t, Options{EPPAddr: startEPP(t, epp, nil)})

	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, gw+"/v1/completions", pr)
	req.Trailer = http.Header{"X-Client-Trailer": nil}
	go func() {
		_, _ = io.WriteString(pw, `{"prompt":"x"}`)
		req.Trailer.Set("X-Client-Trailer", "sum")
		pw.Close()
	}()
	res := do(t, req)
	if res.status != 200 || res.body != "body" {
		t.Fatalf("client got %d %q", res.status, res.body)
	}
	if res.trailer.Get("X-Up-Trailer") != "done" || res.trailer.Get("X-Epp-Trailer") != "resp" {
		t.Errorf("client trailers %v, want the upstream's and the EPP's", res.trailer)
	}
	h := up.got()[0]
	if h.body != `{"prompt":"x"}` || h.trailer["x-client-trailer"] != "sum" || h.trailer["x-epp-trailer"] != "req" {
		t.Errorf("upstream got body %q trailers %v", h.body, h.trailer)
	}
	r := epp.records()[0]
	if r.trailers["x-client-trailer"] != "sum" || r.bodyEOS || !r.respTrailer {
		t.Errorf("EPP saw trailers %v, body eos %v (want false: trailers end the body), response trailers %v", r.trailers, r.bodyEOS, r.respTrailer)
	}
}

// TestTLSAndSubsetHint: the EPP serves TLS with a self-signed certificate, and the subset hint
// reaches it as envoy.lb.subset_hint metadata.
func TestTLSAndSubsetHint(t *testing.T) {
	up := startUpstream(t, nil)
	epp := &scriptedEPP{dest: up.addr}
	addr := startEPP(t, epp, credentials.NewServerTLSFromCert(selfSigned(t)))
	gw := startGateway(t, Options{EPPAddr: addr, TLS: true, SubsetHint: SubsetFromHeader("X-Subset")})
	req := post(t, gw+"/v1/completions", `{}`)
	req.Header.Set("X-Subset", up.addr+", 10.0.0.1")
	if res := do(t, req); res.status != 200 {
		t.Fatalf("status %d %q", res.status, res.body)
	}
	if got := strings.Join(epp.records()[0].subset, ","); got != up.addr+",10.0.0.1" {
		t.Errorf("subset hint %q", got)
	}

	plain := startGateway(t, Options{EPPAddr: addr}) // plaintext against a TLS EPP fails closed
	if res := do(t, post(t, plain+"/v1/completions", `{}`)); res.status < 500 {
		t.Errorf("plaintext client to TLS EPP: status %d, want 5xx", res.status)
	}
}

func TestOptionsRejected(t *testing.T) {
	for _, o := range []Options{
		{},
		{EPPAddr: "nohost"},
		{EPPAddr: "127.0.0.1:9002", FailOpen: true},
		{EPPAddr: "127.0.0.1:9002", DefaultEndpoints: []string{"pod-a:8000"}},
		{EPPAddr: "127.0.0.1:9002", DefaultEndpoints: []string{"10.0.0.1:0"}},
		{EPPAddr: "127.0.0.1:9002", StreamEnd: "rst"},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

func TestListenAndServeStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ListenAndServe(ctx, "127.0.0.1:0", Options{EPPAddr: "127.0.0.1:1"}) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ListenAndServe did not return after cancel")
	}
}

func selfSigned(t *testing.T) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "epp"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestUpstreamDiesMidResponse: a pod that crashes after the client has its first SSE event
// leaves the client with a cut stream (the gateway cannot un-send the 200); one that dies
// before answering gives a 502.
func TestUpstreamDiesMidResponse(t *testing.T) {
	clientHasFirst := make(chan struct{})
	die := func(w http.ResponseWriter) {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close() // the pod is gone
		}
	}
	midStream := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: first\n\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-clientHasFirst:
		case <-r.Context().Done():
		}
		die(w)
	})
	early := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { die(w) })

	gw := startGateway(t, Options{EPPAddr: startEPP(t, &scriptedEPP{dest: midStream.addr}, nil)})
	resp, err := client.Do(post(t, gw+"/v1/completions", `{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: first\n" || resp.StatusCode != 200 {
		t.Fatalf("first event: %d %q %v", resp.StatusCode, line, err)
	}
	close(clientHasFirst)
	if rest, err := io.ReadAll(br); err == nil {
		t.Errorf("stream ended cleanly with %q after the pod died; want it cut", rest)
	}

	gw = startGateway(t, Options{EPPAddr: startEPP(t, &scriptedEPP{dest: early.addr}, nil)})
	if res := do(t, post(t, gw+"/v1/completions", `{}`)); res.status != http.StatusBadGateway {
		t.Errorf("pod died before answering: status %d (%q), want 502", res.status, res.body)
	}
}

// TestUnreadableBodyIsABadRequest: a client body that cannot be read (a malformed chunk) ends
// the exchange before the EPP decides; the client, still connected, gets a 400 saying why, never
// an empty 200.
func TestUnreadableBodyIsABadRequest(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, Options{EPPAddr: startEPP(t, &scriptedEPP{dest: up.addr}, nil)})
	conn, err := net.Dial("tcp", strings.TrimPrefix(gw, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+
		"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\nzz\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(resp.Header.Get("X-Gateway-Error"), "reading the request body") {
		t.Errorf("status %d, x-gateway-error %q; want 400 naming the unreadable body", resp.StatusCode, resp.Header.Get("X-Gateway-Error"))
	}
	if n := len(up.got()); n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
}

// TestKeepAliveAfterAnEarlyAnswer: the EPP answers a POST before its body reached the EPP, the
// client's body having been read to its end (net/http then reads the connection in the
// background for the next request). The next request on the same keep-alive connection is
// served as the first was, not cut short as if its client had left (an empty 200).
func TestKeepAliveAfterAnEarlyAnswer(t *testing.T) {
	read := make(chan struct{})
	var once sync.Once
	testHookBodyRead = func(ctx context.Context) {
		once.Do(func() { close(read) })
		<-ctx.Done()                      // the exchange is ending (cleanup)
		time.Sleep(20 * time.Millisecond) // and decides how to stop the body reader meanwhile
	}
	t.Cleanup(func() { testHookBodyRead = nil })
	up := startUpstream(t, nil)
	epp := &scriptedEPP{dest: up.addr, immediateAt: "headers", answerAfter: read}
	gw := startGateway(t, Options{EPPAddr: startEPP(t, epp, nil)})
	tr := &http.Transport{MaxConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for i := range 2 {
		reused := false
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused }})
		req := post(t, gw+"/v1/completions", `{"prompt":"x"}`).WithContext(ctx)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || string(b) != "shed" || err != nil {
			t.Fatalf("request %d: %d %q (%v), want the EPP's 429", i, resp.StatusCode, b, err)
		}
		if i == 1 && !reused {
			t.Fatal("the second request did not reuse the connection: the test proves nothing")
		}
	}
}
