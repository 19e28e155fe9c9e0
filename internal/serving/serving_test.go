package serving

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/pool"
)

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func onePod() []*pool.Endpoint {
	return []*pool.Endpoint{pool.NewEndpoint("ns", "a", "10.0.0.1", 8000, 0, nil, nil)}
}

// start runs a Server on 127.0.0.1 with free ports; stop() shuts it down and returns Run's result.
func start(t *testing.T, cfg Config, store *pool.Store, obs ...extproc.Observer) (s *Server, stop func() error, done <-chan error) {
	t.Helper()
	cfg.Host, cfg.GRPCPort, cfg.HealthPort = "127.0.0.1", 0, 0
	opts := extproc.Options{}
	if len(obs) > 0 {
		opts.Observer = obs[0]
	}
	s, err := New(cfg, extproc.NewServer(store, nil, opts), store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	var result error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-errc:
			case <-time.After(15 * time.Second):
				result = errors.New("Run did not return within 15s of shutdown")
			}
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return s, stop, errc
}

// watchHealth opens a Watch for service and returns a function yielding each status sent.
func watchHealth(t *testing.T, ctx context.Context, conn *grpc.ClientConn, service string) func() healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatal(err)
	}
	return func() healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("health watch %q: %v", service, err)
		}
		return r.GetStatus()
	}
}

// TestHealthFollowsSync: every readiness name is NOT_SERVING until the pool is synced, on the
// health port and on the ext_proc port, then SERVING; an unsynced publish turns it back.
// Liveness stays SERVING throughout.
func TestHealthFollowsSync(t *testing.T) {
	store := pool.NewStore()
	s, _, _ := start(t, Config{SecureServing: true}, store)
	ctx := testCtx(t)
	plain, err := grpc.NewClient(s.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ext, err := envoy.Dial(s.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close()

	type watch struct {
		where string
		next  func() healthpb.HealthCheckResponse_ServingStatus
	}
	var watches []watch
	for _, name := range ReadinessServices {
		watches = append(watches, watch{"health port " + name, watchHealth(t, ctx, plain, name)})
		watches = append(watches, watch{"ext_proc port " + name, watchHealth(t, ctx, ext.Conn(), name)})
	}
	expect := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, w := range watches {
			if got := w.next(); got != want {
				t.Errorf("%s: %v, want %v", w.where, got, want)
			}
		}
	}
	live := watchHealth(t, ctx, plain, LivenessService)
	if got := live(); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness %v before sync, want SERVING", got)
	}
	expect(healthpb.HealthCheckResponse_NOT_SERVING)
	store.Publish(pool.Info{}, onePod(), false) // endpoints but not yet synced: no change
	store.Publish(pool.Info{}, onePod(), true)
	expect(healthpb.HealthCheckResponse_SERVING)
	store.Publish(pool.Info{}, nil, false)
	expect(healthpb.HealthCheckResponse_NOT_SERVING)

	r, err := healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{Service: "no-such-service"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: %v %v, want NotFound", r, err)
	}
}

// TestSelfSignedTLS: ext_proc speaks TLS with ALPN h2 by default and refuses plain text.
func TestSelfSignedTLS(t *testing.T) {
	store := pool.NewStore()
	store.Publish(pool.Info{}, onePod(), true)
	s, _, _ := start(t, Config{SecureServing: true}, store)
	ctx := testCtx(t)

	conn, err := tls.Dial("tcp", s.ExtProcAddr(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec
	if err != nil {
		t.Fatal(err)
	}
	st := conn.ConnectionState()
	_ = conn.Close()
	if st.NegotiatedProtocol != "h2" || st.PeerCertificates[0].Subject.CommonName != "tandem-epp" {
		t.Errorf("ALPN %q, certificate %q", st.NegotiatedProtocol, st.PeerCertificates[0].Subject.CommonName)
	}

	c, err := envoy.Dial(s.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, routed, err := c.Route(ctx, envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)})
	if err != nil || routed.Destination != "10.0.0.1:8000" {
		t.Fatalf("over TLS: %v %+v", err, routed)
	}

	plainC, err := envoy.Dial(s.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer plainC.Close()
	if _, _, err := plainC.Route(ctx, envoy.Request{Method: "GET", Path: "/", NoBody: true}); err == nil {
		t.Error("a plain-text client was served by the TLS ext_proc port")
	}
}

// writePair writes a fresh self-signed pair into dir and returns its certificate.
func writePair(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	cert, err := SelfSignedCertificate()
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	// Write to temporary names then rename, as a Secret volume swaps files atomically.
	crtPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	for name, data := range map[string][]byte{KeyFile: keyPEM, CertFile: crtPEM} {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	parsed, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return parsed
}

func servedCert(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// TestCertPathReload: the pair in --cert-path is served and replaced when the files change.
func TestCertPathReload(t *testing.T) {
	dir := t.TempDir()
	first := writePair(t, dir)
	store := pool.NewStore()
	s, _, _ := start(t, Config{SecureServing: true, CertPath: dir}, store)
	if got := servedCert(t, s.ExtProcAddr()); !bytes.Equal(got.Raw, first.Raw) {
		t.Fatal("the server does not serve the pair from --cert-path")
	}
	second := writePair(t, dir)
	waitServed(t, s, second)
}

// waitServed waits until the server hands out want. A file event reloads at once; the poll
// (certPollInterval) catches a change made before the watches were set.
func waitServed(t *testing.T, s *Server, want *x509.Certificate) {
	t.Helper()
	deadline := time.After(3 * certPollInterval)
	for {
		if got := servedCert(t, s.ExtProcAddr()); bytes.Equal(got.Raw, want.Raw) {
			return
		}
		select {
		case <-s.reloader.reloaded:
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the new pair was not served within %v", 3*certPollInterval)
		}
	}
}

// TestCertPathKeepsLastGoodPair: files that do not hold a matching pair (a key of another
// certificate, then garbage) leave the last good pair in service; a good pair replaces it.
func TestCertPathKeepsLastGoodPair(t *testing.T) {
	dir := t.TempDir()
	first := writePair(t, dir)
	// The reloader says once per distinct error that the pair on disk does not load; the
	// garbage certificate's error can only come from a load of the final files.
	garbageLoaded := make(chan struct{}, 1)
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "does not load") && strings.Contains(args, "certificate input") {
			select {
			case garbageLoaded <- struct{}{}:
			default:
			}
		}
	}, funcr.Options{})
	s, _, _ := start(t, Config{SecureServing: true, CertPath: dir, Logger: log}, pool.NewStore())
	other := t.TempDir()
	writePair(t, other)
	key, err := os.ReadFile(filepath.Join(other, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, KeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, CertFile), []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-garbageLoaded:
	case <-time.After(3 * certPollInterval):
		t.Fatalf("no failed load of the garbage certificate within %v", 3*certPollInterval)
	}
	if got := servedCert(t, s.ExtProcAddr()); !bytes.Equal(got.Raw, first.Raw) {
		t.Fatal("a bad pair on disk replaced the good one in service")
	}
	third := writePair(t, dir)
	waitServed(t, s, third)
}

// TestCertPathErrors: a bad --cert-path fails at start with the files named.
func TestCertPathErrors(t *testing.T) {
	empty := t.TempDir()
	mismatched := t.TempDir()
	writePair(t, mismatched)
	other := t.TempDir()
	writePair(t, other)
	if err := os.Rename(filepath.Join(other, KeyFile), filepath.Join(mismatched, KeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Host: "127.0.0.1", CertPath: empty}, extproc.NewServer(pool.NewStore(), nil, extproc.Options{}), pool.NewStore()); err == nil ||
		!strings.Contains(err.Error(), "--secure-serving") {
		t.Errorf("--cert-path without --secure-serving: %v, want an error naming --secure-serving", err)
	}
	for name, dir := range map[string]string{"missing files": empty, "key of another certificate": mismatched} {
		t.Run(name, func(t *testing.T) {
			_, err := New(Config{Host: "127.0.0.1", SecureServing: true, CertPath: dir}, extproc.NewServer(pool.NewStore(), nil, extproc.Options{}), pool.NewStore())
			if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, CertFile)) || !strings.Contains(err.Error(), "--cert-path") {
				t.Errorf("error %v should name %s and --cert-path", err, filepath.Join(dir, CertFile))
			}
		})
	}
}

// TestGracefulShutdown: on shutdown health turns NOT_SERVING, an open stream still finishes
// its request and response, Run waits for it, and then the port is closed.
func TestGracefulShutdown(t *testing.T) {
	store := pool.NewStore()
	store.Publish(pool.Info{}, onePod(), true)
	opened := openedObserver(make(chan struct{}, 1))
	s, stop, done := start(t, Config{SecureServing: false, GracePeriod: time.Minute}, store, opened)
	ctx := testCtx(t)
	c, err := envoy.Dial(s.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hc, err := grpc.NewClient(s.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	next := watchHealth(t, ctx, hc, "inference-extension")
	// A watcher on the ext_proc port must not hold the shutdown up.
	_ = watchHealth(t, ctx, c.Conn(), "inference-extension")()
	if got := next(); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v before shutdown", got)
	}
	stream, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)}
	if err := stream.SendRequestHeaders(envoy.Headers(":method", "POST", ":path", req.Path), false, nil); err != nil {
		t.Fatal(err)
	}
	select { // the server holds the stream before shutdown begins
	case <-opened:
	case <-ctx.Done():
		t.Fatal("the server never opened the stream")
	}
	stopErr := make(chan error, 1)
	go func() { stopErr <- stop() }()
	if got := next(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health %v after shutdown began", got)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while a stream was open", err)
	default:
	}
	if err := stream.SendRequestBody(req.Body, true); err != nil {
		t.Fatal(err)
	}
	routed, err := stream.ReadRoute(req)
	if err != nil || routed.Destination != "10.0.0.1:8000" {
		t.Fatalf("the open stream was not served during the grace period: %v %+v", err, routed)
	}
	if _, err := stream.Respond(envoy.Response{Status: 200, Chunks: [][]byte{[]byte("done")}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := <-stopErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	c2, err := envoy.Dial(s.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, _, err := c2.Route(ctx, envoy.Request{Method: "GET", Path: "/", NoBody: true}); err == nil {
		t.Error("a new request was served after shutdown")
	}
}

// TestGracePeriodCutsStreams: a stream still open when the grace period ends is cut and Run returns.
func TestGracePeriodCutsStreams(t *testing.T) {
	store := pool.NewStore()
	store.Publish(pool.Info{}, onePod(), true)
	s, stop, _ := start(t, Config{GracePeriod: 100 * time.Millisecond}, store)
	ctx := testCtx(t)
	c, err := envoy.Dial(s.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stream, routed, err := c.Route(ctx, envoy.Request{Method: "GET", Path: "/", NoBody: true})
	if err != nil || routed.Destination == "" {
		t.Fatalf("route: %v %+v", err, routed)
	}
	began := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("shutdown took %v with a 100ms grace period", took)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
		t.Errorf("the abandoned stream ended with %v, want Unavailable or Canceled", err)
	}
}

// openedObserver signals each stream the ext_proc server opens.
type openedObserver chan struct{}

func (o openedObserver) StreamOpened()                 { o <- struct{}{} }
func (o openedObserver) StreamClosed()                 {}
func (o openedObserver) RequestBody(int)               {}
func (o openedObserver) Decided(extproc.DecisionEvent) {}
func (o openedObserver) RequestFailed(int, string)     {}
func (o openedObserver) Panicked(string)               {}
func (o openedObserver) FieldsRemoved([]string)        {}
