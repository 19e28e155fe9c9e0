package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Gateway is an http.Handler that routes every request through the EPP.
type Gateway struct {
	opts      Options
	conn      *grpc.ClientConn
	client    extprocv3.ExternalProcessorClient
	transport *http.Transport
	nginx     *nginxFront // ClientNGINX only
}

// New validates opts and prepares the EPP connection (dialled lazily, on the first request).
func New(opts Options) (*Gateway, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if opts.TLS {
		// Envoy's cluster for an EPP uses TLS without verification (self-signed serving cert).
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // matches the EPP deployments
	}
	conn, err := grpc.NewClient("passthrough:///"+opts.EPPAddr,
		grpc.WithTransportCredentials(creds),
		// Reconnect quickly after an EPP restart: tests and the demo restart EPPs on purpose.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)),
	)
	if err != nil {
		return nil, fmt.Errorf("gateway: EPP client for %s: %w", opts.EPPAddr, err)
	}
	g := &Gateway{opts: opts, conn: conn, client: extprocv3.NewExternalProcessorClient(conn)}
	dialer := &net.Dialer{Timeout: opts.ConnectTimeout, KeepAlive: 30 * time.Second}
	g.transport = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				if a, ok := ctx.Value(attemptKey{}).(*attempt); ok {
					a.connectFailed.Store(true)
				}
			}
			return c, err
		},
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	if opts.Client == ClientNGINX {
		if g.nginx, err = newNGINXFront(opts); err != nil {
			_ = conn.Close()
			return nil, err
		}
	}
	return g, nil
}

// Close releases the EPP connection and idle upstream connections.
func (g *Gateway) Close() error {
	g.transport.CloseIdleConnections()
	if g.nginx != nil {
		g.nginx.close()
	}
	return g.conn.Close()
}

// ServeHTTP runs one request through the EPP and the endpoint it picks.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.nginx != nil {
		g.serveNGINX(w, r)
		return
	}
	x := newExchange(g, w, r)
	if x.run() {
		// The response had started: cut the client stream (no terminating chunk), as Envoy
		// resets the downstream stream.
		panic(http.ErrAbortHandler)
	}
}

// attempt marks one upstream try, so the dialer can tell a connect failure from other errors.
type attempt struct{ connectFailed atomic.Bool }

type attemptKey struct{}

// ListenAndServe serves a Gateway on addr until ctx ends.
func ListenAndServe(ctx context.Context, addr string, opts Options) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("gateway: listen on %s: %w", addr, err)
	}
	return Serve(ctx, ln, opts)
}

// Serve serves a Gateway on ln until ctx ends, then shuts down (in-flight requests get 5s).
func Serve(ctx context.Context, ln net.Listener, opts Options) error {
	g, err := New(opts)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer g.Close()
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	opts.Logger.Info("gateway listening", "addr", ln.Addr().String(), "epp", opts.EPPAddr, "tls", opts.TLS, "failOpen", opts.FailOpen)
	select {
	case err := <-errc:
		return fmt.Errorf("gateway: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("gateway: serve: %w", err)
	}
	return nil
}
