package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tandem-epp/tandem/internal/advisor"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/health"
	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/ledger/redisledger"
	"github.com/tandem-epp/tandem/internal/logging"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/objective"
	"github.com/tandem-epp/tandem/internal/outcome"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/pool/file"
	"github.com/tandem-epp/tandem/internal/proof"
	"github.com/tandem-epp/tandem/internal/serving"
	"github.com/tandem-epp/tandem/internal/version"
)

// Run parses args as the epp command line and runs Tandem until ctx ends.
func Run(ctx context.Context, args []string, stdout io.Writer) error {
	opts, err := ParseFlags(args, stdout, os.Getenv)
	if err != nil {
		return err
	}
	if opts.Version {
		_, err := fmt.Fprintln(stdout, version.Line("epp"))
		return err
	}
	a, err := New(ctx, opts, Env{Getenv: os.Getenv, Environ: os.Environ()})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// Env is the process environment the app reads (injectable for tests).
type Env struct {
	Getenv  func(string) string
	Environ []string
	// RestConfig, when set, is used instead of --kubeconfig / in-cluster discovery.
	RestConfig *RestConfig
}

// App is a configured Tandem, listening but not yet serving until Run.
type App struct {
	opts     *Options
	log      logr.Logger
	reg      *prometheus.Registry
	store    *pool.Store
	gw       config.Gateway
	deps     *picker.Deps
	cascade  *pd.Cascade
	picker   *Picker
	tel      *tel
	handoff  *handoff.Adapters
	router   *picker.Router
	tokens   *pd.TokenLoad
	shared   *redisledger.Shared
	scraper  *metrics.Scraper
	outcomes *outcome.Recorder
	health   *health.Detector
	transfer *proof.Gate
	advice   *advisor.Published
	serving  *serving.Server
	metricsL net.Listener
	// objectives are the InferenceObjectives requests may name (cluster or endpoints file).
	objectives *objective.Set
	source     func(ctx context.Context) error
	// retire forgets the state of endpoints whose pod left or changed (picker.Deps.RetireDeparted),
	// watching the store from New on, before any source publishes.
	retire func(ctx context.Context)
	// configData is the --config-file content applied; getenv the environment over it.
	configData []byte
	getenv     func(string) string
}

// New validates the configuration, builds every component and opens the listeners, so a bad
// setting fails here, before anything serves.
func New(ctx context.Context, opts *Options, env Env) (*App, error) {
	log := logging.New(opts.Zap)
	setKubeLogger(log)
	a := &App{opts: opts, log: log, reg: prometheus.NewRegistry(), store: pool.NewStore()}
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Configuration: defaults < --config-file < environment.
	var cfgFile *config.File
	if opts.ConfigFile != "" {
		data, err := os.ReadFile(opts.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("--config-file: %w", err)
		}
		if cfgFile, err = config.ParseFile(opts.ConfigFile, data, config.FileOptions{KnownPluginTypes: pd.IsPluginType}); err != nil {
			return nil, err
		}
		a.configData = data
	}
	a.getenv = env.Getenv
	gw, warns, err := config.Load(cfgFile, env.Getenv)
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	for _, w := range warns {
		log.Info("configuration warning", "warning", w.String())
	}
	for _, w := range config.UnknownEnv(env.Environ) {
		log.Info("WARNING: unknown environment variable, ignored", "variable", w.Field, "problem", w.Message)
	}
	a.gw = gw

	tel, err := newTelemetry(a.reg, log)
	if err != nil {
		return nil, err
	}
	// The one record of every routed request (written by the decisions' lifecycles and the
	// ext_proc server) and of every probe, and passive health reading it; the latency models
	// and the advisor read it too (BuildPicker).
	a.outcomes = outcome.NewRecorder(nil)
	a.health = health.New(health.Options{Config: gw.Outlier, Store: a.store, Observer: healthObserver{tel.m},
		Logger: log.WithName("outlier-detection"), Recorder: a.outcomes})
	a.outcomes.Subscribe(a.health)
	// The proof of each PD request's KV transfer, judged by the ext_proc server onto the route,
	// counted, and (lenient policy) holding out decode pods that keep recomputing.
	a.transfer = proof.NewGate(proof.GateOptions{Observer: tel.m, Logger: log.WithName("pd-transfer"),
		InPool: func(key string) bool { return a.store.Load().Has(key) }})
	a.outcomes.Subscribe(a.transfer)
	// InferenceObjectives (x-gateway-inference-objective), from the cluster or the endpoints file.
	objectives := &objective.Set{}
	a.objectives = objectives
	pk, err := BuildPicker(PickerOptions{Gateway: gw, File: cfgFile, Objectives: objectives,
		Reporter: tel.annotationReporter(), Logger: log, Gauges: tel.m, BucketMetrics: tel.m, Predictions: tel.m, Health: a.health,
		Transfer: a.transfer, Outcomes: a.outcomes})
	if err != nil {
		return nil, err
	}
	for _, w := range pk.Warnings {
		log.Info("config file warning", "warning", w)
	}
	a.picker, a.tel = pk, tel
	// The P:D ratio advisor's gauges and its status endpoint (GET /advice on the metrics port).
	a.advice = pk.Advisor.Publish(a.store.Load)
	a.reg.MustRegister(a.advice)
	a.router, a.deps, a.tokens, a.cascade = pk.Router, pk.Deps, pk.Tokens, pk.Cascade
	a.retire = a.deps.RetireDeparted(a.store)
	// The "epp" hand-off (TANDEM_PD_HANDOFF / routingConfig.handoff): Tandem runs prefill legs.
	a.handoff, err = handoff.NewAdapters(gw.PD, handoff.Options{Observer: tel.handoffObserver(), Log: log.WithName("handoff"),
		KVHoldTimeout: gw.KVHoldTimeout})
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	if opts.RedisAddr != "" {
		// Replicas share their request counts (running, pending, prefill in flight, drain rate),
		// pd-predictive's booked prefill work and, unless AIBRIX_TOKEN_LOAD_SHARED_LEDGER=false,
		// the decode ledger, in one round trip. Without Redis, pd-predictive adds the prompts the
		// engines report waiting beyond its own to its predicted waits.
		var dec *ledger.Decode
		if gw.PD.TokenLoadSharedLedger {
			dec = a.tokens.Decode
		}
		prefill, pending := a.cascade.Trackers()
		counts := &redisledger.RequestCounts{Running: a.deps.Running, Pending: pending, Prefill: prefill, Drain: a.deps.Drain,
			Endpoints: func() []string {
				eps := a.store.Load().Endpoints
				keys := make([]string, len(eps))
				for i, e := range eps {
					keys[i] = e.Key()
				}
				return keys
			}}
		a.shared, err = redisledger.New(redisledger.Options{Addr: opts.RedisAddr, Password: opts.RedisPassword,
			TLS: opts.RedisTLS, TLSSkipVerify: opts.RedisTLSSkipVerify, Clock: a.deps.Clock,
			Logger: log.WithName("shared-ledger"), Latency: pk.Models, Rejected: tel.m.RedisValuesRejected}, dec, counts)
		if err != nil {
			return nil, fmt.Errorf("shared request counts (--redis-addr=%s): %w", opts.RedisAddr, err)
		}
	}
	sched := &observedScheduler{inner: a.router, m: tel.m}

	// Engine metrics scraped into the picker's sample store.
	a.scraper, err = metrics.NewScraper(a.store, a.deps.Metrics, metrics.ScrapeOptions{
		Interval: gw.MetricRefreshInterval, Observer: scrapeProbes{Metrics: tel.m, rec: a.outcomes},
	})
	if err != nil {
		return nil, fmt.Errorf("metric scraping: %w", err)
	}

	// Pool source.
	if opts.EndpointsFile != "" {
		path := opts.EndpointsFile
		a.source = func(ctx context.Context) error {
			w := &file.Watcher{Path: path, Store: a.store, PairMatch: gw.PairMatch(), Logger: log.WithName("endpoints-file"),
				OnError: func(err error) { tel.sourceError("file", err) }, OnObjectives: objectives.Replace}
			if err := w.Load(); err != nil {
				return err
			}
			return w.Run(ctx)
		}
		// Fail fast on a bad file: nothing else can work without it.
		if _, _, err := file.Load(path); err != nil {
			return nil, err
		}
	} else if a.source, err = kubeSource(opts, env, a.store, gw.PairMatch(), objectives, tel, log); err != nil {
		return nil, err
	}

	if opts.MetricsPort > 0 || opts.metricsAnyPort {
		a.metricsL, err = net.Listen("tcp", net.JoinHostPort(opts.BindAddress, strconv.Itoa(opts.MetricsPort)))
		if err != nil {
			return nil, fmt.Errorf("--metrics-port=%d: %w", opts.MetricsPort, err)
		}
	}
	bodyTimeout := opts.RequestBodyTimeout
	if bodyTimeout == 0 {
		bodyTimeout = -1 // the flag's 0 disables it; extproc's zero means its default
	}
	headersTimeout := opts.RequestHeadersTimeout
	if headersTimeout == 0 {
		headersTimeout = -1 // the flag's 0 disables it; extproc's zero means its default
	}
	ext := extproc.NewServer(a.store, sched, extproc.Options{
		MaxBodyBytes: opts.MaxBodyBytes, ConformanceMode: opts.Conformance,
		DebugTraceHeader: opts.DebugTraceHeader, Logger: log, Observer: tel.extprocObserver(),
		Handoff: a.handoff, TrustClientPDFields: opts.TrustClientPDFields,
		Client: opts.GatewayClient, Fallbacks: opts.DestinationFallbacks, DestinationOnlyHold: opts.DestinationOnlyHold,
		Outcomes: a.outcomes, Health: a.health, Retry: gw.Retry,
		Transfer: a.transfer, Prefill: extproc.LatencyPrefill(pk.Models), TransferHeader: gw.PD.TransferHeader,
		Limits: extproc.Limits{MaxStreams: opts.MaxStreams, MaxBufferedBodyBytes: opts.MaxBufferedBodyBytes,
			RequestBodyTimeout: bodyTimeout, RequestHeadersTimeout: headersTimeout},
	})
	tel.m.BufferedBodyBytesFrom(func() float64 { return float64(ext.BufferedBodyBytes()) })
	a.serving, err = serving.New(serving.Config{
		Host: opts.BindAddress, GRPCPort: opts.GRPCPort, HealthPort: opts.GRPCHealthPort,
		SecureServing: opts.SecureServing, CertPath: opts.CertPath, GracePeriod: opts.GracePeriod,
		Logger: log.WithName("serving"), Recovered: tel.grpcRecovered,
		MaxStreamsPerConnection: opts.MaxStreamsPerConnection, KeepaliveMinTime: opts.GRPCKeepaliveMinTime,
		KeepaliveTime: opts.GRPCKeepaliveTime, KeepaliveTimeout: opts.GRPCKeepaliveTimeout, MaxConnectionIdle: opts.GRPCMaxConnectionIdle,
	}, ext, a.store)
	if err != nil {
		if a.metricsL != nil {
			a.metricsL.Close()
		}
		return nil, err
	}
	return a, nil
}

// ExtProcAddr, HealthAddr and MetricsAddr are the listening addresses (useful with port 0).
func (a *App) ExtProcAddr() string { return a.serving.ExtProcAddr() }
func (a *App) HealthAddr() string  { return a.serving.HealthAddr() }
func (a *App) MetricsAddr() string {
	if a.metricsL == nil {
		return ""
	}
	return a.metricsL.Addr().String()
}

// Store is the pool store the source publishes to.
func (a *App) Store() *pool.Store { return a.store }

// Run serves until ctx ends, then shuts down gracefully. It returns the first component error.
func (a *App) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		once sync.Once
		res  error
	)
	run := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := f(ctx)
			if err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
				once.Do(func() { res = fmt.Errorf("%s: %w", name, err) })
				a.log.Error(err, "component failed; shutting down", "component", name)
			}
			cancel()
		}()
	}
	run("pool source", a.source)
	if a.opts.ConfigFile != "" {
		run("config file watcher", func(ctx context.Context) error { a.watchConfig(ctx); return nil })
	}
	run("metric scraper", a.scraper.Run)
	run("outlier detection", func(ctx context.Context) error { a.health.Run(ctx); return nil })
	run("prefix warmer", func(ctx context.Context) error { a.deps.Warmer.Run(ctx); return nil })
	run("departed endpoint retirer", func(ctx context.Context) error { a.retire(ctx); return nil })
	run("janitor", func(ctx context.Context) error {
		ledger.RunJanitor(ctx, 0, append(a.tokens.Sweepers(), a.picker.Models)...)
		return nil
	})
	if a.shared != nil {
		run("shared request counts and decode ledger", func(ctx context.Context) error { a.shared.Run(ctx); return a.shared.Close() })
	}
	run("disaggregation check", func(ctx context.Context) error {
		warnDisaggregation(ctx, a.store, a.gw, a.opts.GatewayClient, a.log)
		return nil
	})
	run("pool check", func(ctx context.Context) error { checkPool(ctx, a.store, a.picker, a.log.WithName("pool")); return nil })
	run("grpc servers", a.serving.Run)
	if a.metricsL != nil {
		srv := &http.Server{Handler: a.metricsHandler(), ReadHeaderTimeout: 10 * time.Second}
		run("metrics server", func(ctx context.Context) error {
			go func() { <-ctx.Done(); _ = srv.Close() }()
			if err := srv.Serve(a.metricsL); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	a.log.Info("tandem started", "version", version.Get().Version, "commit", version.Get().Commit, "extproc", a.ExtProcAddr(), "health", a.HealthAddr(), "metrics", a.MetricsAddr())
	wg.Wait()
	a.handoff.Close()
	return res
}

func (a *App) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	mux.Handle("/advice", a.advice)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return mux
}
