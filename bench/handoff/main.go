// Command handoff measures the time Tandem's "epp" hand-off adds to time to first token: the
// same streaming chat request goes (a) through the local gateway to Tandem, which runs the
// prefill leg and rewrites the decode body, then on to the decode pod, and (b) directly from
// the client to the same simulated vLLM pods — the prefill leg, then the decode leg with the
// body the same handoff adapter builds. The pods have a zero latency model, so what remains
// is the path: the gateway hop and Tandem's ext_proc conversation. Both paths alternate
// request by request so machine noise hits them alike. Run with `make bench-handoff`.
// It is a measurement, not part of Tandem: it must not be imported.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/gateway"
	"github.com/tandem-epp/tandem/internal/handoff"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/sim"
)

const model = "m"

var body = []byte(`{"model":"m","messages":[{"role":"system","content":"You are terse."},` +
	`{"role":"user","content":"Name three ships and one sea, please."}],"max_tokens":4,"stream":true}`)

func main() {
	pairs := flag.Int("requests", 1500, "request pairs (direct + through Tandem) per concurrency level")
	levels := flag.String("concurrency", "1,32", "comma-separated concurrency levels")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (all components) to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench-handoff:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*pairs, *levels); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "bench-handoff:", err)
		os.Exit(1)
	}
}

func run(pairs int, levels string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := start(ctx)
	if err != nil {
		return err
	}
	defer b.stop()

	var conc []int
	for _, s := range bytes.Split([]byte(levels), []byte(",")) {
		n, err := strconv.Atoi(string(bytes.TrimSpace(s)))
		if err != nil || n < 1 {
			return fmt.Errorf("-concurrency %q: want positive integers", levels)
		}
		conc = append(conc, n)
	}
	fmt.Printf("pods: vLLM prefill + decode (sim, zero latency model), hand-off vllm/shfs; %d request pairs per level\n", pairs)
	fmt.Printf("%-12s %10s %10s %10s %10s %12s %12s\n", "concurrency", "direct p50", "direct p99", "tandem p50", "tandem p99", "overhead p50", "overhead p99")
	var first [2]float64
	for i, c := range conc {
		// Warm both paths (connections, pools) before measuring.
		if _, _, err := b.measure(ctx, c, 4*c); err != nil {
			return err
		}
		direct, tandem, err := b.measure(ctx, c, pairs)
		if err != nil {
			return err
		}
		d50, d99, t50, t99 := pct(direct, 50), pct(direct, 99), pct(tandem, 50), pct(tandem, 99)
		fmt.Printf("%-12d %9.3fms %9.3fms %9.3fms %9.3fms %10.3fms %10.3fms\n", c, d50, d99, t50, t99, t50-d50, t99-d99)
		fmt.Printf("RESULT handoff_overhead_p50_ms_c%d=%.3f\n", c, t50-d50)
		fmt.Printf("RESULT handoff_overhead_p99_ms_c%d=%.3f\n", c, t99-d99)
		if i == 0 {
			first = [2]float64{t50 - d50, t99 - d99}
		}
	}
	fmt.Printf("# headline: concurrency %d (TTFT through the local gateway + Tandem minus the direct TTFT)\n", conc[0])
	fmt.Printf("RESULT handoff_overhead_p50_ms=%.3f\n", first[0])
	fmt.Printf("RESULT handoff_overhead_p99_ms=%.3f\n", first[1])
	return nil
}

// pct is the p-th percentile of xs (milliseconds), nearest rank.
func pct(xs []time.Duration, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return float64(s[i]) / float64(time.Millisecond)
}

type bench struct {
	prefill, decode *sim.Server
	gatewayURL      string
	adapters        *handoff.Adapters
	pd              config.PD
	client          *http.Client
	stops           []func()
}

func (b *bench) stop() {
	for i := len(b.stops) - 1; i >= 0; i-- {
		b.stops[i]()
	}
}

func start(ctx context.Context) (*bench, error) {
	b := &bench{pd: config.DefaultPD(),
		client: &http.Client{Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 256, Proxy: nil}}}
	p := sim.DefaultParams()
	p.PrefillBase, p.PrefillPerToken, p.PrefillQuadratic = 0, 0, 0
	p.DecodeBase, p.DecodePerSeq, p.TransferBase, p.TransferPerToken = 0, 0, 0, 0
	p.PrefillLanes, p.MaxRunning = 64, 256
	var err error
	for _, role := range []string{sim.RolePrefill, sim.RoleDecode} {
		s, e := sim.Start(ctx, sim.PodConfig{Name: "vllm-" + role, Engine: sim.EngineVLLM, Role: role, Model: model,
			Params: p, RecordLimit: 1})
		if e != nil {
			b.stop()
			return nil, e
		}
		b.stops = append(b.stops, s.Close)
		if role == sim.RolePrefill {
			b.prefill = s
		} else {
			b.decode = s
		}
	}
	if b.adapters, err = handoff.NewAdapters(b.pd, handoff.Options{}); err != nil {
		b.stop()
		return nil, err
	}
	b.stops = append(b.stops, b.adapters.Close)

	dir, err := os.MkdirTemp("", "bench-handoff-")
	if err != nil {
		b.stop()
		return nil, err
	}
	b.stops = append(b.stops, func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "endpoints.yaml")
	if err := writePool(path, b.prefill, b.decode); err != nil {
		b.stop()
		return nil, err
	}
	env := map[string]string{"TANDEM_PD_HANDOFF": "epp"}
	getenv := func(k string) string { return env[k] }
	opts, err := app.ParseFlags([]string{"--endpoints-file=" + path, "--grpc-port=0", "--grpc-health-port=0",
		"--metrics-port=0", "--bind-address=127.0.0.1", "--zap-log-level=error"}, io.Discard, getenv)
	if err != nil {
		b.stop()
		return nil, err
	}
	a, err := app.New(ctx, opts, app.Env{Getenv: getenv})
	if err != nil {
		b.stop()
		return nil, err
	}
	appCtx, stopApp := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(appCtx) }()
	b.stops = append(b.stops, func() { stopApp(); <-done })
	if err := demo.WaitServing(ctx, a.HealthAddr(), nil, 30*time.Second); err != nil {
		b.stop()
		return nil, err
	}
	g, err := gateway.New(gateway.Options{EPPAddr: a.ExtProcAddr(), TLS: true, Logger: logr.Discard()})
	if err != nil {
		b.stop()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.stop()
		return nil, err
	}
	hs := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	b.stops = append(b.stops, func() { _ = hs.Close(); _ = g.Close() })
	b.gatewayURL = "http://" + ln.Addr().String()
	return b, nil
}

func writePool(path string, prefill, decode *sim.Server) error {
	var f demo.EndpointsFile
	for _, x := range []struct {
		s    *sim.Server
		role string
	}{{prefill, "prefill"}, {decode, "decode"}} {
		f.Endpoints = append(f.Endpoints, demo.SimEndpoint(x.role+"-0", x.s, map[string]string{
			pool.LabelModelName: model, pool.LabelEngine: "vllm", "role-name": x.role, "roleset-name": "rs-0"}, nil))
	}
	return f.Write(path)
}

// measure runs n request pairs on c workers; each worker alternates the two paths.
func (b *bench) measure(ctx context.Context, c, n int) (direct, tandem []time.Duration, err error) {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
		next = make(chan int)
	)
	go func() {
		defer close(next)
		for i := range n {
			next <- i
		}
	}()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				var d, t time.Duration
				var e1, e2 error
				if i%2 == 0 {
					d, e1 = b.direct(ctx, i)
					t, e2 = b.viaTandem(ctx)
				} else {
					t, e2 = b.viaTandem(ctx)
					d, e1 = b.direct(ctx, i)
				}
				mu.Lock()
				if e := errors.Join(e1, e2); e != nil {
					errs = append(errs, e)
				} else {
					direct, tandem = append(direct, d), append(tandem, t)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, nil, fmt.Errorf("%d of %d pairs failed, first: %w", len(errs), n, errs[0])
	}
	return direct, tandem, nil
}

// direct is the client doing the hand-off itself: the prefill leg, then the decode leg with
// the body the same adapter builds. TTFT runs from the prefill request to the first token.
func (b *bench) direct(ctx context.Context, i int) (time.Duration, error) {
	began := time.Now()
	h, err := b.adapters.New(ctx, handoff.Input{PD: b.pd, Leg: handoff.Leg{
		RequestID: "bench-" + strconv.Itoa(i), Path: "/v1/chat/completions", API: request.APIChatCompletions, Body: body,
		Prefill: endpointOf(b.prefill, "prefill-0"), Decode: endpointOf(b.decode, "decode-0")}})
	if err != nil {
		return 0, err
	}
	defer h.Done()
	decodeBody, aerr := h.Start(ctx)
	if aerr != nil {
		return 0, aerr
	}
	return b.firstToken(ctx, "http://"+b.decode.HostPort()+"/v1/chat/completions", decodeBody, began)
}

func (b *bench) viaTandem(ctx context.Context) (time.Duration, error) {
	return b.firstToken(ctx, b.gatewayURL+"/v1/chat/completions", body, time.Now())
}

// firstToken posts a streaming request and returns the time from began to the first SSE
// event carrying content, then drains the stream.
func (b *bench) firstToken(ctx context.Context, url string, payload []byte, began time.Time) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("%s: status %d: %s", url, resp.StatusCode, msg)
	}
	r := bufio.NewReader(resp.Body)
	var ttft time.Duration
	for {
		line, err := r.ReadBytes('\n')
		if ttft == 0 && bytes.Contains(line, []byte(`"content":"`)) && !bytes.Contains(line, []byte(`"content":""`)) {
			ttft = time.Since(began)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if ttft == 0 {
		return 0, fmt.Errorf("%s: no token in the stream", url)
	}
	return ttft, nil
}

var (
	epMu  sync.Mutex
	epMap = map[string]*pool.Endpoint{}
)

// endpointOf is the pool endpoint of a simulated pod, built once.
func endpointOf(s *sim.Server, name string) *pool.Endpoint {
	epMu.Lock()
	defer epMu.Unlock()
	if e, ok := epMap[name]; ok {
		return e
	}
	host, port, _ := net.SplitHostPort(s.HostPort())
	n, _ := strconv.Atoi(port)
	e := pool.NewEndpoint("default", name, host, int32(n), 0, map[string]string{pool.LabelEngine: "vllm"}, nil)
	epMap[name] = e
	return e
}
