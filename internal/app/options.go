package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/logging"
	"github.com/tandem-epp/tandem/internal/serving"
)

// Options are the command-line settings of the EPP. Names and defaults follow GIE's lwepp so
// Tandem can replace it in the upstream conformance manifests unchanged.
type Options struct {
	PoolName      string
	PoolNamespace string
	PoolGroup     string
	Kubeconfig    string
	TargetPorts   intList

	GRPCPort       int
	GRPCHealthPort int
	MetricsPort    int
	BindAddress    string
	SecureServing  bool
	CertPath       string
	HealthChecking bool

	EndpointsFile string
	ConfigFile    string

	Conformance      bool
	MaxBodyBytes     int
	DebugTraceHeader bool
	GracePeriod      time.Duration

	// Limits (extproc.Limits) and trust of client-sent PD control fields.
	MaxStreams           int
	MaxBufferedBodyBytes int64
	RequestBodyTimeout   time.Duration
	TrustClientPDFields  bool

	// Connection limits of the ext_proc server (config.LimitFlags).
	RequestHeadersTimeout   time.Duration
	MaxStreamsPerConnection int
	GRPCKeepaliveMinTime    time.Duration
	GRPCKeepaliveTime       time.Duration
	GRPCKeepaliveTimeout    time.Duration
	GRPCMaxConnectionIdle   time.Duration

	// What the gateway client applies of an answer (config.GatewayClientFlags).
	GatewayClient        string
	DestinationFallbacks string
	DestinationOnlyHold  time.Duration

	RedisAddr          string
	RedisPassword      string
	RedisTLS           bool
	RedisTLSSkipVerify bool

	Zap logging.Options

	// Version: print the version and exit (--version); nothing else is checked.
	Version bool

	// metricsAnyPort serves /metrics on a free port when MetricsPort is 0 (tests).
	metricsAnyPort bool
	// configPoll is how often the --config-file is re-read besides its change notifications
	// (0: the watcher's default).
	configPoll time.Duration
}

type intList []int

func (l *intList) String() string {
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l *intList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q is not a port number (1-65535)", p)
		}
		*l = append(*l, n)
	}
	return nil
}

// NewFlagSet declares every flag on a fresh FlagSet bound to o.
func NewFlagSet(o *Options, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("epp", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Tandem: a prefill/decode-aware Endpoint Picker for the Gateway API Inference Extension.

Usage: epp [flags]

Pool source: --pool-name (Kubernetes InferencePool) or --endpoints-file (YAML, no cluster).
Routing knobs are AIBRIX_* environment variables (see docs/configuration.md).

Flags may start with - or --.
`)
		printGroupedFlags(fs.Output(), fs)
	}
	fs.StringVar(&o.PoolName, "pool-name", "", "Name of the InferencePool this EPP serves (Kubernetes source).")
	fs.StringVar(&o.PoolNamespace, "pool-namespace", "", "Namespace of the InferencePool; empty means $NAMESPACE or \"default\".")
	fs.StringVar(&o.PoolGroup, "pool-group", "inference.networking.k8s.io", "API group of the InferencePool; only inference.networking.k8s.io (v1) is supported.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig; empty uses in-cluster config or $KUBECONFIG.")
	fs.Var(&o.TargetPorts, "endpoint-target-ports", "Accepted for lwepp compatibility; target ports come from the InferencePool.")
	fs.IntVar(&o.GRPCPort, "grpc-port", 9002, "Port of the ext_proc gRPC server.")
	fs.IntVar(&o.GRPCHealthPort, "grpc-health-port", 9003, "Port of the gRPC health server: services liveness (the process answers), readiness (the pool has synced; not while shutting down), and, like readiness, envoy.service.ext_proc.v3.ExternalProcessor, inference-extension and \"\".")
	fs.IntVar(&o.MetricsPort, "metrics-port", 9090, "Port of the Prometheus /metrics endpoint; 0 disables it.")
	fs.StringVar(&o.BindAddress, "bind-address", "", "Address the servers listen on; empty means all interfaces.")
	fs.BoolVar(&o.SecureServing, "secure-serving", true, "Serve ext_proc over TLS: a self-signed certificate made at start, or the one in --cert-path.")
	fs.StringVar(&o.CertPath, "cert-path", "", "Directory holding tls.crt and tls.key for ext_proc; reloaded when they change.")
	fs.BoolVar(&o.HealthChecking, "health-checking", false, "Also serve gRPC health on the ext_proc port (lwepp compatibility).")
	fs.StringVar(&o.EndpointsFile, "endpoints-file", "", "YAML file of endpoints to route to instead of a Kubernetes InferencePool; reloaded on change.")
	fs.StringVar(&o.ConfigFile, "config-file", "", "EndpointPickerConfig YAML (GIE's or llm-d's shape) declaring plugins, scheduling profiles and gateway settings; reloaded when it changes (a bad version is rejected and the last good one kept).")
	fs.BoolVar(&o.Conformance, "conformance", false, "Conformance mode: honour the test-epp-endpoint-selection header and echo x-conformance-test-served-endpoint. Never in production.")
	fs.IntVar(&o.MaxBodyBytes, "max-body-bytes", extproc.DefaultMaxBodyBytes, limitFlag("max-body-bytes"))
	fs.IntVar(&o.MaxStreams, "max-streams", extproc.DefaultMaxStreams, limitFlag("max-streams"))
	fs.Int64Var(&o.MaxBufferedBodyBytes, "max-buffered-body-bytes", extproc.DefaultMaxBufferedBodyBytes, limitFlag("max-buffered-body-bytes"))
	fs.DurationVar(&o.RequestBodyTimeout, "request-body-timeout", extproc.DefaultRequestBodyTimeout, limitFlag("request-body-timeout"))
	fs.DurationVar(&o.RequestHeadersTimeout, "request-headers-timeout", extproc.DefaultRequestHeadersTimeout, limitFlag("request-headers-timeout"))
	fs.IntVar(&o.MaxStreamsPerConnection, "max-streams-per-connection", serving.DefaultMaxStreamsPerConnection, limitFlag("max-streams-per-connection"))
	fs.DurationVar(&o.GRPCKeepaliveMinTime, "grpc-keepalive-min-time", serving.DefaultKeepaliveMinTime, limitFlag("grpc-keepalive-min-time"))
	fs.DurationVar(&o.GRPCKeepaliveTime, "grpc-keepalive-time", serving.DefaultKeepaliveTime, limitFlag("grpc-keepalive-time"))
	fs.DurationVar(&o.GRPCKeepaliveTimeout, "grpc-keepalive-timeout", serving.DefaultKeepaliveTimeout, limitFlag("grpc-keepalive-timeout"))
	fs.DurationVar(&o.GRPCMaxConnectionIdle, "grpc-max-connection-idle", serving.DefaultMaxConnectionIdle, limitFlag("grpc-max-connection-idle"))
	fs.BoolVar(&o.TrustClientPDFields, "trust-client-pd-fields", false, limitFlag("trust-client-pd-fields"))
	fs.StringVar(&o.GatewayClient, "gateway-client", config.ClientAuto, clientFlag("gateway-client"))
	fs.StringVar(&o.DestinationFallbacks, "destination-fallbacks", config.FallbacksAuto, clientFlag("destination-fallbacks"))
	fs.DurationVar(&o.DestinationOnlyHold, "destination-only-hold", DefaultDestinationOnlyHold, clientFlag("destination-only-hold"))
	fs.BoolVar(&o.DebugTraceHeader, "debug-trace-header", false, "Return each decision's trace in the x-tandem-trace response header.")
	fs.DurationVar(&o.GracePeriod, "grace-period", 30*time.Second, "How long open streams may run on after a shutdown signal.")
	fs.StringVar(&o.RedisAddr, "redis-addr", "", "Redis host:port through which replicas share their request counts, decode ledger and pd-predictive's booked prefill work (also $TANDEM_REDIS_ADDR, else AIBrix's $REDIS_HOST and $REDIS_PORT); empty keeps them local.")
	fs.StringVar(&o.RedisPassword, "redis-password", "", "Redis password (prefer $TANDEM_REDIS_PASSWORD, else AIBrix's $REDIS_PASSWORD).")
	fs.BoolVar(&o.RedisTLS, "redis-tls", false, "Connect to Redis over TLS (also $TANDEM_REDIS_TLS).")
	fs.BoolVar(&o.RedisTLSSkipVerify, "redis-tls-insecure-skip-verify", false, "Do not verify the Redis server certificate.")
	fs.BoolVar(&o.Version, "version", false, "Print the version, commit and Go version, then exit.")
	o.Zap.BindFlags(fs)
	return fs
}

// fsDefault is the reference's default of one of config.LimitFlags.
func fsDefault(name string) string {
	for _, f := range config.LimitFlags {
		if f.Name == name {
			return f.Default
		}
	}
	return ""
}

// limitFlag is the description of one of config.LimitFlags (the reference shows the same text).
func limitFlag(name string) string {
	for _, f := range config.LimitFlags {
		if f.Name == name {
			return strings.ReplaceAll(f.Description, "`", "")
		}
	}
	panic("no config.LimitFlags entry for --" + name)
}

// DefaultDestinationOnlyHold is --destination-only-hold's default.
const DefaultDestinationOnlyHold = 15 * time.Second

// clientFlag is the description of one of config.GatewayClientFlags.
func clientFlag(name string) string {
	for _, f := range config.GatewayClientFlags {
		if f.Name == name {
			return strings.ReplaceAll(f.Description, "`", "")
		}
	}
	panic("no config.GatewayClientFlags entry for --" + name)
}

// ErrHelp is returned by ParseFlags when --help was asked for (usage already printed).
var ErrHelp = flag.ErrHelp

// ParseFlags parses args into Options and checks them.
func ParseFlags(args []string, out io.Writer, getenv func(string) string) (*Options, error) {
	o := &Options{}
	fs := NewFlagSet(o, out)
	fs.SetOutput(io.Discard) // a mistake is one line (flagError); only --help prints the help
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(out)
			fs.Usage()
			return nil, err
		}
		return nil, flagError(fs, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: epp takes flags only (see --help)", fs.Args())
	}
	if o.Version {
		return o, nil
	}
	if o.PoolNamespace == "" {
		o.PoolNamespace = getenv("NAMESPACE")
		if o.PoolNamespace == "" {
			o.PoolNamespace = "default"
		}
	}
	// Redis: the flag, else Tandem's variable, else AIBrix's REDIS_HOST (and REDIS_PORT, default
	// 6379) and REDIS_PASSWORD, so an AIBrix gateway Deployment's env works unchanged. A flag
	// given on the command line wins over the variables, even when it says off or empty.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["redis-addr"] {
		o.RedisAddr = getenv("TANDEM_REDIS_ADDR")
	}
	if o.RedisAddr == "" && !set["redis-addr"] {
		if host := strings.TrimSpace(getenv("REDIS_HOST")); host != "" {
			port := strings.TrimSpace(getenv("REDIS_PORT"))
			if link, ok := strings.CutPrefix(port, "tcp://"); ok {
				// Kubernetes' service link, set in every pod of a namespace with a Service
				// named redis: its port is the Service's.
				if _, p, err := net.SplitHostPort(link); err == nil {
					port = p
				}
			}
			if port == "" {
				port = "6379"
			}
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return nil, fmt.Errorf("REDIS_PORT=%q: want a port number (1-65535) for REDIS_HOST=%s, or set --redis-addr", port, host)
			}
			o.RedisAddr = net.JoinHostPort(host, port)
		}
	}
	if !set["redis-password"] {
		o.RedisPassword = getenv("TANDEM_REDIS_PASSWORD")
		if o.RedisPassword == "" {
			o.RedisPassword = getenv("REDIS_PASSWORD")
		}
	}
	if raw := strings.TrimSpace(getenv("TANDEM_REDIS_TLS")); raw != "" {
		tls, err := strconv.ParseBool(raw)
		if err != nil {
			// A typo must not send the password in plain text, and is a mistake even where the
			// flag decides.
			return nil, fmt.Errorf("TANDEM_REDIS_TLS=%q: want true or false, or unset it", raw)
		}
		if !set["redis-tls"] {
			o.RedisTLS = tls
		}
	}
	return o, o.validate()
}

func (o *Options) validate() error {
	var errs []error
	switch {
	case o.PoolName == "" && o.EndpointsFile == "":
		errs = append(errs, errors.New("no pool source: set --pool-name (Kubernetes InferencePool) or --endpoints-file (YAML)"))
	case o.PoolName != "" && o.EndpointsFile != "":
		errs = append(errs, errors.New("--pool-name and --endpoints-file are exclusive: choose one pool source"))
	}
	if o.PoolGroup != "inference.networking.k8s.io" {
		errs = append(errs, fmt.Errorf("--pool-group=%q: only inference.networking.k8s.io (InferencePool v1) is supported", o.PoolGroup))
	}
	for name, p := range map[string]int{"--grpc-port": o.GRPCPort, "--grpc-health-port": o.GRPCHealthPort} {
		if p < 0 || p > 65535 {
			errs = append(errs, fmt.Errorf("%s=%d: must be a port number 0-65535 (0 picks a free port)", name, p))
		}
	}
	if o.MetricsPort < 0 || o.MetricsPort > 65535 {
		errs = append(errs, fmt.Errorf("--metrics-port=%d: must be a port number 0-65535 (0 disables)", o.MetricsPort))
	}
	// Two servers cannot listen on one port: name both flags, not the one that binds first.
	ports := []struct {
		flag string
		port int
	}{{"--grpc-port", o.GRPCPort}, {"--grpc-health-port", o.GRPCHealthPort}, {"--metrics-port", o.MetricsPort}}
	for i, a := range ports {
		for _, b := range ports[i+1:] {
			if a.port > 0 && a.port == b.port {
				errs = append(errs, fmt.Errorf("%s and %s are both %d: each server needs its own port", a.flag, b.flag, a.port))
			}
		}
	}
	if o.MaxBodyBytes <= 0 {
		errs = append(errs, fmt.Errorf("--max-body-bytes=%d: must be positive", o.MaxBodyBytes))
	}
	if o.MaxStreams <= 0 {
		errs = append(errs, fmt.Errorf("--max-streams=%d: must be positive", o.MaxStreams))
	}
	if o.MaxBufferedBodyBytes < int64(o.MaxBodyBytes) {
		errs = append(errs, fmt.Errorf("--max-buffered-body-bytes=%d: must be at least --max-body-bytes (%d), or no body of the largest size could arrive",
			o.MaxBufferedBodyBytes, o.MaxBodyBytes))
	}
	if o.RequestBodyTimeout < 0 {
		errs = append(errs, fmt.Errorf("--request-body-timeout=%s: must not be negative (0 disables it)", o.RequestBodyTimeout))
	}
	if o.RequestHeadersTimeout < 0 {
		errs = append(errs, fmt.Errorf("--request-headers-timeout=%s: must not be negative (0 disables it)", o.RequestHeadersTimeout))
	}
	if o.MaxStreamsPerConnection <= 0 || o.MaxStreamsPerConnection > math.MaxInt32 {
		errs = append(errs, fmt.Errorf("--max-streams-per-connection=%d: must be between 1 and %d", o.MaxStreamsPerConnection, math.MaxInt32))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"grpc-keepalive-min-time", o.GRPCKeepaliveMinTime}, {"grpc-keepalive-time", o.GRPCKeepaliveTime},
		{"grpc-keepalive-timeout", o.GRPCKeepaliveTimeout}, {"grpc-max-connection-idle", o.GRPCMaxConnectionIdle}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("--%s=%s: must be positive, e.g. %s", d.name, d.v, fsDefault(d.name)))
		}
	}
	switch o.GatewayClient {
	case config.ClientAuto, config.ClientFull, config.ClientDestinationOnly:
	default:
		errs = append(errs, fmt.Errorf("--gateway-client=%q: must be one of %s, %s, %s", o.GatewayClient,
			config.ClientAuto, config.ClientFull, config.ClientDestinationOnly))
	}
	switch o.DestinationFallbacks {
	case config.FallbacksAuto, config.FallbacksOn, config.FallbacksOff:
	default:
		errs = append(errs, fmt.Errorf("--destination-fallbacks=%q: must be one of %s, %s, %s", o.DestinationFallbacks,
			config.FallbacksAuto, config.FallbacksOn, config.FallbacksOff))
	}
	if o.DestinationOnlyHold < 0 {
		errs = append(errs, fmt.Errorf("--destination-only-hold=%s: must not be negative (0 releases at the end of the stream)", o.DestinationOnlyHold))
	}
	if o.GracePeriod < 0 {
		errs = append(errs, fmt.Errorf("--grace-period=%s: must not be negative", o.GracePeriod))
	}
	return errors.Join(errs...)
}
