package serving

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"strconv"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/tandem-epp/tandem/internal/pool"
)

// The gRPC health services of the Endpoint Picker Protocol (GIE v1.6, proposal 004).
const (
	// LivenessService is SERVING while the process answers gRPC, synced or not, and through
	// the shutdown's grace period.
	LivenessService = "liveness"
	// ReadinessService is SERVING once the pool has synced, NOT_SERVING before and from the
	// start of shutdown. Tandem has no leader election (every replica keeps its own view of the
	// pool and serves), so there is no follower state to report.
	ReadinessService = "readiness"
)

// ReadinessServices are the health names that follow readiness: readiness itself, ext_proc's
// own name (the protocol's rule, and what Envoy's cluster health check asks), lwepp's
// "inference-extension" (what the upstream conformance manifests probe) and the whole
// server ("").
var ReadinessServices = []string{ReadinessService, extprocv3.ExternalProcessor_ServiceDesc.ServiceName, "inference-extension", ""}

// Defaults, lwepp-compatible where lwepp has the same knob.
const (
	DefaultGRPCPort       = 9002
	DefaultHealthPort     = 9003
	DefaultGracePeriod    = 30 * time.Second
	DefaultMaxRecvMsgSize = 16 << 20
	// DefaultMaxStreamsPerConnection is the HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS of the
	// ext_proc server. A gateway multiplexes its requests' streams over few connections;
	// Envoy's connection pool treats a connection at the peer's limit as full and opens
	// another, and its default circuit breaker allows 1024 requests per cluster anyway, so
	// 1024 never throttles it; it keeps one connection from taking every --max-streams slot.
	DefaultMaxStreamsPerConnection = 1024
	// Keepalive: a client may ping at most every DefaultKeepaliveMinTime (faster pingers are
	// disconnected); the server pings a connection silent for DefaultKeepaliveTime and closes
	// it when no answer comes within DefaultKeepaliveTimeout (a peer that vanished frees its
	// streams); a connection with no stream for DefaultMaxConnectionIdle is closed (GOAWAY; a
	// gateway reconnects on its next request).
	DefaultKeepaliveMinTime  = 10 * time.Second
	DefaultKeepaliveTime     = time.Minute
	DefaultKeepaliveTimeout  = 20 * time.Second
	DefaultMaxConnectionIdle = 5 * time.Minute
)

// Config says where and how to serve.
type Config struct {
	// Host is the address to listen on; "" means every interface.
	Host string
	// GRPCPort serves ext_proc, HealthPort the gRPC health service. 0 picks a free port
	// (tests); read the chosen one back with ExtProcAddr and HealthAddr.
	GRPCPort   int
	HealthPort int
	// SecureServing serves ext_proc over TLS (ALPN h2): the pair in CertPath when set
	// (reloaded on change), otherwise a self-signed certificate made at start.
	SecureServing bool
	CertPath      string
	// GracePeriod is how long open ext_proc streams may run after shutdown starts before
	// they are cut (default DefaultGracePeriod).
	GracePeriod time.Duration
	// MaxRecvMsgSize bounds one ext_proc message (default 16 MiB: a gateway misconfigured to
	// BUFFERED sends the whole body in one).
	MaxRecvMsgSize int
	// MaxStreamsPerConnection, KeepaliveMinTime, KeepaliveTime, KeepaliveTimeout and
	// MaxConnectionIdle bound what one ext_proc connection holds (zero: the defaults above).
	MaxStreamsPerConnection int
	KeepaliveMinTime        time.Duration
	KeepaliveTime           time.Duration
	KeepaliveTimeout        time.Duration
	MaxConnectionIdle       time.Duration
	// Recovered, when set, is told about a panic that escaped a gRPC handler (the outer
	// safety net: the ext_proc server recovers its own per stream). The call gets an Internal
	// status; the process goes on. Nil logs it.
	Recovered func(method string, value any, stack []byte)
	Logger    logr.Logger
}

// Server is the pair of gRPC servers, listening from New until Run returns.
type Server struct {
	cfg      Config
	log      logr.Logger
	store    *pool.Store
	ext      *grpc.Server
	healthS  *grpc.Server
	health   *health.Server
	extLis   net.Listener
	hlthLis  net.Listener
	reloader *certReloader
	draining chan struct{} // closed when shutdown begins
}

// New listens on both ports and registers ext on the ext_proc server. Nothing is served
// until Run. LivenessService is SERVING; ReadinessServices follow store's Synced flag.
func New(cfg Config, ext extprocv3.ExternalProcessorServer, store *pool.Store) (*Server, error) {
	if cfg.CertPath != "" && !cfg.SecureServing {
		return nil, fmt.Errorf("--cert-path %q is set but --secure-serving is off: drop --cert-path or turn --secure-serving on", cfg.CertPath)
	}
	if cfg.GracePeriod <= 0 {
		cfg.GracePeriod = DefaultGracePeriod
	}
	if cfg.MaxRecvMsgSize <= 0 {
		cfg.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	cfg.connectionDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger, store: store, health: health.NewServer()}
	s.health.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	s.setReadiness(healthpb.HealthCheckResponse_NOT_SERVING)

	if cfg.Recovered == nil {
		cfg.Recovered = func(method string, v any, stack []byte) {
			s.log.Error(fmt.Errorf("panic: %v", v), "recovered a panic in a gRPC handler", "method", method, "stack", string(stack))
		}
	}
	guard := grpc.ChainStreamInterceptor(recoverStream(cfg.Recovered))
	guardUnary := grpc.ChainUnaryInterceptor(recoverUnary(cfg.Recovered))
	opts := []grpc.ServerOption{
		guard, guardUnary,
		grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize),
		// Gateways keep ext_proc connections open for long; let them ping.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: cfg.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.MaxConnectionIdle,
			Time: cfg.KeepaliveTime, Timeout: cfg.KeepaliveTimeout}),
		grpc.MaxConcurrentStreams(uint32(cfg.MaxStreamsPerConnection)),
	}
	if cfg.SecureServing {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
		if cfg.CertPath != "" {
			r, err := newCertReloader(cfg.CertPath, s.log)
			if err != nil {
				return nil, err
			}
			s.reloader = r
			tc.GetCertificate = r.getCertificate
		} else {
			cert, err := SelfSignedCertificate()
			if err != nil {
				return nil, err
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	s.ext = grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(s.ext, ext)
	// Envoy health-checks the ext_proc port itself. Watch streams there end when shutdown
	// begins, or they would hold GracefulStop for the whole grace period.
	s.draining = make(chan struct{})
	healthpb.RegisterHealthServer(s.ext, drainingHealth{s.health, s.draining})
	// Kubelet gRPC probes speak plain text, so the health port never uses TLS.
	s.healthS = grpc.NewServer(guard, guardUnary)
	healthpb.RegisterHealthServer(s.healthS, s.health)

	var err error
	if s.extLis, err = net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.GRPCPort))); err != nil {
		return nil, fmt.Errorf("listening for ext_proc on --grpc-port %d: %w", cfg.GRPCPort, err)
	}
	if s.hlthLis, err = net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.HealthPort))); err != nil {
		_ = s.extLis.Close()
		return nil, fmt.Errorf("listening for gRPC health on --grpc-health-port %d: %w", cfg.HealthPort, err)
	}
	return s, nil
}

func (c *Config) connectionDefaults() {
	if c.MaxStreamsPerConnection <= 0 {
		c.MaxStreamsPerConnection = DefaultMaxStreamsPerConnection
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&c.KeepaliveMinTime, DefaultKeepaliveMinTime}, {&c.KeepaliveTime, DefaultKeepaliveTime},
		{&c.KeepaliveTimeout, DefaultKeepaliveTimeout}, {&c.MaxConnectionIdle, DefaultMaxConnectionIdle}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
}

// ExtProcAddr is the ext_proc listener's address ("host:port").
func (s *Server) ExtProcAddr() string { return s.extLis.Addr().String() }

// HealthAddr is the health listener's address ("host:port").
func (s *Server) HealthAddr() string { return s.hlthLis.Addr().String() }

// Run serves until ctx ends, then shuts down gracefully: readiness turns NOT_SERVING (liveness
// stays SERVING while the health port answers), the ext_proc listener closes, open ext_proc
// streams get GracePeriod to finish and are cut after it, then the health server stops.
// It returns nil after a shutdown and the error when a server fails.
func (s *Server) Run(ctx context.Context) error {
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	if s.reloader != nil {
		s.reloader.start(watchCtx)
	}
	synced := make(chan struct{})
	go s.followSync(watchCtx, synced)

	errc := make(chan error, 2)
	go func() { errc <- serveErr("ext_proc", s.ext.Serve(s.extLis)) }()
	go func() { errc <- serveErr("health", s.healthS.Serve(s.hlthLis)) }()
	s.log.Info("serving", "extProc", s.ExtProcAddr(), "health", s.HealthAddr(), "tls", s.cfg.SecureServing)

	var failed error
	select {
	case <-ctx.Done():
	case failed = <-errc:
	}
	stopWatch()
	<-synced // followSync has stopped, so this NOT_SERVING is final
	s.setReadiness(healthpb.HealthCheckResponse_NOT_SERVING)
	close(s.draining)
	s.log.Info("shutting down", "gracePeriod", s.cfg.GracePeriod.String())

	drained := make(chan struct{})
	go func() { s.ext.GracefulStop(); close(drained) }()
	timer := time.NewTimer(s.cfg.GracePeriod)
	defer timer.Stop()
	select {
	case <-drained:
	case <-timer.C:
		s.log.Info("grace period over; cutting the remaining ext_proc streams")
		s.ext.Stop()
		<-drained
	}
	// Health watchers are long-lived streams: stop, do not wait for them.
	s.healthS.Stop()
	return failed
}

// followSync mirrors the pool's Synced flag into the health status until ctx ends.
func (s *Server) followSync(ctx context.Context, stopped chan<- struct{}) {
	defer close(stopped)
	changes := s.store.Changes() // subscribe before the first Load so no publish is missed
	last, first := false, true
	for {
		if synced := s.store.Load().Synced; synced != last || first {
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if synced {
				st = healthpb.HealthCheckResponse_SERVING
			}
			s.setReadiness(st)
			if synced != last {
				s.log.Info("health", "status", st.String())
			}
			last, first = synced, false
		}
		select {
		case <-ctx.Done():
			return
		case <-changes:
		}
	}
}

// setReadiness sets every name of ReadinessServices to st.
func (s *Server) setReadiness(st healthpb.HealthCheckResponse_ServingStatus) {
	for _, name := range ReadinessServices {
		s.health.SetServingStatus(name, st)
	}
}

// recoverStream and recoverUnary turn a panic that escaped a handler into an Internal status
// for that call alone: without them one bad request would end the process.
func recoverStream(report func(string, any, []byte)) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				report(info.FullMethod, r, debug.Stack())
				err = status.Error(codes.Internal, "internal error in "+info.FullMethod)
			}
		}()
		return handler(srv, ss)
	}
}

func recoverUnary(report func(string, any, []byte)) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				report(info.FullMethod, r, debug.Stack())
				err = status.Error(codes.Internal, "internal error in "+info.FullMethod)
			}
		}()
		return handler(ctx, req)
	}
}

func serveErr(what string, err error) error {
	if err == nil || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("%s server: %w", what, err)
}

// Run is New followed by Server.Run.
func Run(ctx context.Context, cfg Config, ext extprocv3.ExternalProcessorServer, store *pool.Store) error {
	s, err := New(cfg, ext, store)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// drainingHealth is the health service on the ext_proc port: Check as usual, Watch ends
// once draining is closed (after the watcher was sent NOT_SERVING, unless it raced the end).
type drainingHealth struct {
	*health.Server
	draining <-chan struct{}
}

func (h drainingHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-h.draining:
			cancel()
		case <-ctx.Done():
		}
	}()
	return h.Server.Watch(req, watchStream{stream, ctx})
}

type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w watchStream) Context() context.Context { return w.ctx }
