// Command gateway runs the local test gateway: an HTTP server that asks an Endpoint Picker
// over ext_proc where each request goes, as Envoy does, then proxies there. Test and demo
// tooling only; production uses Envoy-based gateways (see internal/gateway/README.md). It
// only parses flags and serves internal/gateway; it must not hold proxy logic of its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/tandem-epp/tandem/internal/gateway"
	"github.com/tandem-epp/tandem/internal/version"
)

func main() {
	err := run(os.Args[1:])
	var usage usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, &usage):
		fmt.Fprintln(os.Stderr, "gateway:", err, "(gateway -h lists the flags)")
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// usageError is a mistake on the command line (exit 2), not a failure to serve (exit 1).
type usageError struct{ error }

func run(args []string) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8080", "HTTP address to serve clients on")
	epp := fs.String("epp", "127.0.0.1:9002", "the EPP's ext_proc gRPC address")
	eppTLS := fs.Bool("epp-tls", true, "speak TLS to the EPP without verifying its certificate (the EPP's --secure-serving default); false for plaintext")
	failOpen := fs.Bool("fail-open", false, "when the EPP is unreachable or fails before deciding, route to --default-endpoints instead of answering 503/500")
	defaults := fs.String("default-endpoints", "", "comma-separated ip:port list for --fail-open, tried in order")
	subsetHeader := fs.String("subset-header", "", "if set, a client header whose comma-separated ip[:port] list is sent to the EPP as the subset hint")
	decision := fs.Duration("decision-timeout", 60*time.Second, "longest wait for the EPP's routing decision")
	connect := fs.Duration("connect-timeout", 2*time.Second, "TCP connect timeout per endpoint before the next fallback")
	upstream := fs.Duration("upstream-timeout", 0, "longest wait for an endpoint's response headers once the request was sent, answered 504 (Envoy's route timeout); 0: none")
	verbosity := fs.Int("v", 0, "log verbosity: 1 logs every request")
	showVersion := fs.Bool("version", false, "print the version, commit and Go version, then exit")
	clientKind := fs.String("client", gateway.ClientEnvoy, "ext_proc client to play: envoy, or nginx (NGINX Gateway Fabric's shim; needs --default-endpoints, the pool's pods)")
	streamEnd := fs.String("stream-end", gateway.EndReset, "how an ext_proc stream ends early (the client left): reset, or envoy (half-close, then reset, as Envoy's ext_proc filter)")
	strip := fs.String("strip-headers", "", "nginx client: comma-separated request headers removed before the upstream request (an HTTPRoute RequestHeaderModifier)")
	// A mistyped flag gets one line (main), not the whole help: only -h prints that.
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stderr)
			fmt.Fprintln(os.Stderr, "Usage of gateway, the local test gateway (flags may start with - or --):")
			fs.PrintDefaults()
			return err
		}
		return usageError{err}
	}
	if *showVersion {
		fmt.Println(version.Line("gateway"))
		return nil
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q: all settings are flags", fs.Args())}
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: *verbosity})
	opts := gateway.Options{
		EPPAddr: *epp, TLS: *eppTLS, FailOpen: *failOpen, Logger: log,
		DecisionTimeout: *decision, ConnectTimeout: *connect, UpstreamTimeout: *upstream, Client: *clientKind,
		StreamEnd: *streamEnd,
	}
	for _, h := range strings.Split(*strip, ",") {
		if h = strings.TrimSpace(h); h != "" {
			opts.StripHeaders = append(opts.StripHeaders, h)
		}
	}
	for _, e := range strings.Split(*defaults, ",") {
		if e = strings.TrimSpace(e); e != "" {
			opts.DefaultEndpoints = append(opts.DefaultEndpoints, e)
		}
	}
	if h := *subsetHeader; h != "" {
		opts.SubsetHint = gateway.SubsetFromHeader(h)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return gateway.ListenAndServe(ctx, *listen, opts)
}
