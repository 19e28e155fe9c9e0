package gateway

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// Options configure a Gateway. The zero value of every field except EPPAddr is usable.
type Options struct {
	// EPPAddr is the EPP's ext_proc gRPC address, "host:port".
	EPPAddr string
	// TLS speaks TLS to the EPP without verifying its certificate, as Envoy is configured
	// for EPPs with self-signed serving certificates; false speaks plaintext gRPC.
	TLS bool
	// FailOpen routes to DefaultEndpoints when the EPP is unreachable or its stream fails
	// before it has decided; false (fail-closed) answers 503 (unreachable) or 500.
	FailOpen bool
	// DefaultEndpoints are the "ip:port" tried in order when failing open.
	DefaultEndpoints []string
	// Logger receives one line per request at V(1) and every failure; zero value discards.
	Logger logr.Logger
	// SubsetHint, when set, is called per request; a non-nil result is sent to the EPP as
	// the envoy.lb.subset_hint metadata (a list of "ip[:port]"). For tests.
	SubsetHint func(*http.Request) []string
	// DecisionTimeout bounds the wait for the EPP's request-headers answer (it comes after
	// the whole body). Expiry counts as a stream failure before the decision. Default 60s.
	DecisionTimeout time.Duration
	// ConnectTimeout bounds one TCP connect to an endpoint before the next fallback is
	// tried. Default 2s.
	ConnectTimeout time.Duration
	// UpstreamTimeout bounds the wait for an endpoint's response headers once the request was
	// sent, as Envoy's route timeout does for a response that has not started: expiry answers
	// 504 (through the EPP's response phase, as every local reply). Zero: no bound.
	UpstreamTimeout time.Duration
	// Client is the ext_proc client the gateway plays: ClientEnvoy ("" too) or ClientNGINX
	// (NGINX Gateway Fabric: see nginx.go). ClientNGINX needs DefaultEndpoints, the pool's
	// pods, which it falls back to at random whenever the EPP gives no endpoint.
	Client string
	// StreamEnd is how the gateway ends an ext_proc stream early (the client left, or the
	// exchange failed): EndReset ("" too) resets it; EndEnvoy half-closes it and then resets
	// it, the order of Envoy's ext_proc filter, which also resets the stream right after the
	// half-close that follows a complete response.
	StreamEnd string
	// StripHeaders are request headers removed before the upstream request in ClientNGINX
	// mode: an HTTPRoute RequestHeaderModifier remove filter, which NGF renders as
	// proxy_set_header NAME "" (the EPP still sees them; the pod does not).
	StripHeaders []string
}

func (o *Options) validate() error {
	if o.EPPAddr == "" {
		return fmt.Errorf("gateway: EPPAddr is empty: set it to the EPP's ext_proc address, e.g. 127.0.0.1:9002")
	}
	if _, _, err := net.SplitHostPort(o.EPPAddr); err != nil {
		return fmt.Errorf("gateway: EPPAddr %q is not host:port: %w", o.EPPAddr, err)
	}
	for i, e := range o.DefaultEndpoints {
		if err := checkEndpoint(e); err != nil {
			return fmt.Errorf("gateway: DefaultEndpoints[%d]: %w", i, err)
		}
	}
	switch o.Client {
	case "", ClientEnvoy:
	case ClientNGINX:
		if len(o.DefaultEndpoints) == 0 {
			return fmt.Errorf("gateway: the %s client needs DefaultEndpoints (the pool's pods, nginx's upstream when the EPP gives no endpoint)", ClientNGINX)
		}
	default:
		return fmt.Errorf("gateway: Client %q: must be %q or %q", o.Client, ClientEnvoy, ClientNGINX)
	}
	switch o.StreamEnd {
	case "", EndReset, EndEnvoy:
	default:
		return fmt.Errorf("gateway: StreamEnd %q: must be %q (a plain reset) or %q (half-close, then reset, as Envoy)", o.StreamEnd, EndReset, EndEnvoy)
	}
	if o.FailOpen && len(o.DefaultEndpoints) == 0 {
		return fmt.Errorf("gateway: FailOpen needs DefaultEndpoints (the ip:port to route to when the EPP is down)")
	}
	if o.DecisionTimeout < 0 || o.ConnectTimeout < 0 || o.UpstreamTimeout < 0 {
		return fmt.Errorf("gateway: DecisionTimeout, ConnectTimeout and UpstreamTimeout must not be negative")
	}
	if o.DecisionTimeout == 0 {
		o.DecisionTimeout = 60 * time.Second
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = 2 * time.Second
	}
	return nil
}

// How the gateway ends an ext_proc stream early (Options.StreamEnd).
const (
	EndReset = "reset"
	EndEnvoy = "envoy"
)

// checkEndpoint accepts "ip:port" with a literal IP and a port in 1..65535.
func checkEndpoint(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not ip:port: %w", s, err)
	}
	if net.ParseIP(host) == nil {
		return fmt.Errorf("%q: host %q is not an IP address", s, host)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port %q is not in 1-65535", s, port)
	}
	return nil
}

// parseDestinations splits the EPP's "ip:port,ip:port" list. Invalid entries are skipped, as
// Envoy's override-host load balancer skips them; the error lists them when none is valid.
func parseDestinations(s string) ([]string, error) {
	var out, bad []string
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if err := checkEndpoint(e); err != nil {
			bad = append(bad, err.Error())
			continue
		}
		out = append(out, e)
	}
	if len(out) == 0 && len(bad) > 0 {
		return nil, fmt.Errorf("no valid endpoint in %q: %s", s, strings.Join(bad, "; "))
	}
	return out, nil
}

// SubsetFromHeader returns a SubsetHint that reads a comma-separated "ip[:port]" list from
// the named client header; requests without it carry no hint.
func SubsetFromHeader(name string) func(*http.Request) []string {
	return func(r *http.Request) []string {
		v := r.Header.Get(name)
		if v == "" {
			return nil
		}
		var out []string
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
		return out
	}
}
