// Command metrics measures the engine-metrics scraper (internal/metrics) against real HTTP
// servers on 127.0.0.1 serving a realistic vLLM V1 page:
//
//   - scrape_parse_us: one scrape-and-parse cycle of one endpoint (wall time, sequential);
//   - scrape_cost_ratio_histograms: CPU per cycle reading the engines' queue-time, TTFT and
//     inter-token histograms too, over the signals read without them, side by side;
//   - cpu_cores_1024_endpoints: CPU time of the scraping process ÷ wall time while the Scraper
//     keeps 1024 endpoints fresh at the default interval (getrusage over a window).
//
// The servers run in a child process (this binary with -serve), so the parent's rusage counts
// scraping alone. Run from the repository root (`make bench-metrics`); the page path is relative
// to it. It must not be imported: it is a measurement, not part of Tandem.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/telemetry"
)

func main() {
	var (
		serve     = flag.Int("serve", 0, "internal: serve the page on this many loopback ports and print them")
		page      = flag.String("page", "internal/metrics/testdata/vllm_v1_dp2.prom", "metrics page to serve (path from the repository root)")
		endpoints = flag.Int("endpoints", 1024, "endpoints kept fresh for the CPU measurement")
		window    = flag.Duration("window", 10*time.Second, "CPU measurement window")
		cycles    = flag.Int("cycles", 2000, "sequential scrape-and-parse cycles for scrape_parse_us")
		profile   = flag.String("cpuprofile", "", "write a CPU profile of the steady-state window here")
	)
	flag.Parse()
	body, err := os.ReadFile(*page)
	if err != nil {
		fail("read page: %v (run from the repository root, or pass -page)", err)
	}
	if *serve > 0 {
		runServers(*serve, body)
		return
	}
	interval, err := metrics.IntervalFromEnv(nil)
	if err != nil {
		fail("%v", err)
	}

	ports, stop := startChild(*endpoints, *page)
	defer stop()
	fmt.Printf("page %s: %d bytes; %d endpoints; interval %s (%s)\n", *page, len(body), len(ports), interval, metrics.EnvRefreshInterval)

	eps := make([]*pool.Endpoint, len(ports))
	for i, p := range ports {
		eps[i] = pool.NewEndpoint("bench", fmt.Sprintf("vllm-%04d", i), "127.0.0.1", int32(p), 0,
			map[string]string{pool.LabelEngine: pool.EngineVLLM}, nil)
	}

	// 1. One scrape-and-parse cycle, sequential, over a kept-alive connection.
	one, err := metrics.NewScraper(pool.NewStore(), metrics.NewStore(), metrics.ScrapeOptions{})
	if err != nil {
		fail("%v", err)
	}
	ctx := context.Background()
	for range 50 { // warm the connection and the allocator
		if _, err := one.ScrapeNow(ctx, eps[0]); err != nil {
			fail("warm-up scrape: %v", err)
		}
	}
	cpu0, t0 := cpuTime(), time.Now()
	for range *cycles {
		if _, err := one.ScrapeNow(ctx, eps[0]); err != nil {
			fail("scrape: %v", err)
		}
	}
	wall, cpu := time.Since(t0), cpuTime()-cpu0
	fmt.Printf("scrape+parse: %d cycles, wall %.1f µs/cycle, CPU %.1f µs/cycle\n", *cycles,
		us(wall)/float64(*cycles), us(cpu)/float64(*cycles))
	fmt.Printf("RESULT scrape_parse_us=%.1f\n", us(wall)/float64(*cycles))

	// 1b. The same page with the signals Tandem read before the engines' queue-time, TTFT
	// and inter-token histograms joined the dialect (an empty spec switches a signal off),
	// side by side: blocks of cycles alternating, CPU per cycle, the ratio the median of the
	// rounds'.
	today, err := metrics.NewScraper(pool.NewStore(), metrics.NewStore(), metrics.ScrapeOptions{Dialects: map[string]metrics.Dialect{
		pool.EngineVLLM: {Names: map[metrics.Field]string{metrics.FieldQueueTime: "", metrics.FieldTTFT: "", metrics.FieldInterToken: ""}}}})
	if err != nil {
		fail("%v", err)
	}
	for range 50 {
		if _, err := today.ScrapeNow(ctx, eps[1]); err != nil {
			fail("warm-up scrape: %v", err)
		}
	}
	block := func(s *metrics.Scraper, ep *pool.Endpoint, n int) time.Duration {
		c0 := cpuTime()
		for range n {
			if _, err := s.ScrapeNow(ctx, ep); err != nil {
				fail("scrape: %v", err)
			}
		}
		return cpuTime() - c0
	}
	var withH, withoutH time.Duration
	var ratios []float64
	const rounds, per = 41, 60
	for r := range rounds {
		var a, b time.Duration
		if r%2 == 0 {
			a = block(one, eps[0], per)
			b = block(today, eps[1], per)
		} else {
			b = block(today, eps[1], per)
			a = block(one, eps[0], per)
		}
		withH, withoutH = withH+a, withoutH+b
		ratios = append(ratios, float64(a)/float64(b))
	}
	sort.Float64s(ratios)
	n := float64(rounds * per)
	fmt.Printf("side by side, %d×%d cycles: with the histograms %.1f µs CPU/cycle, without %.1f µs CPU/cycle (ratio of the totals %.3f), round ratios p10/p50/p90 %.3f/%.3f/%.3f\n",
		rounds, per, us(withH)/n, us(withoutH)/n, float64(withH)/float64(withoutH), ratios[rounds/10], ratios[rounds/2], ratios[rounds*9/10])
	fmt.Printf("RESULT scrape_cpu_us_with_histograms=%.1f\n", us(withH)/n)
	fmt.Printf("RESULT scrape_cpu_us_without_histograms=%.1f\n", us(withoutH)/n)
	fmt.Printf("RESULT scrape_cost_ratio_histograms=%.3f\n", ratios[len(ratios)/2])
	if ratios[len(ratios)/2] > 1.25 {
		fmt.Println("GOAL MISSED: the histograms add at most 25 % per scrape")
	}

	// 2. Keep every endpoint fresh with the real Scraper at the default interval.
	ps, samples := pool.NewStore(), metrics.NewStore()
	ps.Publish(pool.Info{}, eps, true)
	tm, err := telemetry.New(prometheus.NewRegistry())
	if err != nil {
		fail("%v", err)
	}
	obs := &countingObserver{Metrics: tm}
	s, err := metrics.NewScraper(ps, samples, metrics.ScrapeOptions{Interval: interval, Observer: obs})
	if err != nil {
		fail("%v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(rctx) }()
	warm := time.Now()
	for len(samples.Keys()) < len(eps) {
		if time.Since(warm) > 30*time.Second {
			fail("only %d of %d endpoints scraped after 30 s", len(samples.Keys()), len(eps))
		}
		time.Sleep(interval / 4) // polling a counter for the warm-up, not synchronisation
	}
	// Skip one more interval so the window holds only steady-state rounds.
	time.Sleep(interval)
	okBefore, errBefore := obs.ok.Load(), obs.errs.Load()
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			fail("%v", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fail("%v", err)
		}
		defer pprof.StopCPUProfile()
	}
	cpu0, t0 = cpuTime(), time.Now()
	time.Sleep(*window)
	cpu, wall = cpuTime()-cpu0, time.Since(t0)
	ok, errs := obs.ok.Load()-okBefore, obs.errs.Load()-errBefore
	cancel()
	<-done

	cores := cpu.Seconds() / wall.Seconds()
	perSec := float64(ok) / wall.Seconds()
	fmt.Printf("steady state: %d good + %d failed scrapes in %.1f s = %.0f scrapes/s (expected %.0f at %s); CPU %.3f s\n",
		ok, errs, wall.Seconds(), perSec, float64(len(eps))/interval.Seconds(), interval, cpu.Seconds())
	fmt.Printf("per scrape: %.1f µs CPU\n", us(cpu)/float64(max(ok+errs, 1)))
	fmt.Printf("RESULT cpu_cores_1024_endpoints=%.3f\n", cores*1024/float64(len(eps)))
	if cores*1024/float64(len(eps)) >= 0.2 {
		fmt.Println("GOAL MISSED: < 0.2 cores for 1024 endpoints")
	}
}

// countingObserver is Tandem's telemetry (as cmd/epp wires it, so its cost is counted) that
// also counts scrapes.
type countingObserver struct {
	*telemetry.Metrics
	ok, errs atomic.Int64
}

func (c *countingObserver) ScrapeDone(ep *pool.Endpoint, took time.Duration, class string) {
	c.Metrics.ScrapeDone(ep, took, class)
	if class == "" {
		c.ok.Add(1)
	} else {
		c.errs.Add(1)
	}
}

// startChild runs this binary with -serve and reads the ports it listens on.
func startChild(n int, page string) ([]int, func()) {
	self, err := os.Executable()
	if err != nil {
		fail("%v", err)
	}
	cmd := exec.Command(self, "-serve", strconv.Itoa(n), "-page", page)
	cmd.Stderr = os.Stderr
	// The servers die with us, even when we exit through fail().
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		fail("%v", err)
	}
	if err := cmd.Start(); err != nil {
		fail("start servers: %v", err)
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		stop()
		fail("servers printed no ports")
	}
	var ports []int
	for _, f := range strings.Fields(sc.Text()) {
		p, err := strconv.Atoi(f)
		if err != nil {
			stop()
			fail("bad port %q", f)
		}
		ports = append(ports, p)
	}
	return ports, stop
}

// runServers serves the page on n loopback ports, varying the running-request gauge and the
// generation-token counter between responses as an engine would, and prints the ports.
func runServers(n int, page []byte) {
	const running = `vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0`
	const tokens = `vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 30000.0`
	var variants [][]byte
	for i := range 8 {
		v := bytes.Replace(page, []byte(running), fmt.Appendf(nil, `vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} %d.0`, i), 1)
		v = bytes.Replace(v, []byte(tokens), fmt.Appendf(nil, `vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} %d.0`, 30000+i*1000), 1)
		variants = append(variants, v)
	}
	var hits atomic.Uint64
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		v := variants[hits.Add(1)%uint64(len(variants))]
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(v)))
		_, _ = w.Write(v)
	})
	ports := make([]string, n)
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fail("listen: %v", err)
		}
		ports[i] = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		go func() { _ = http.Serve(ln, h) }()
	}
	fmt.Println(strings.Join(ports, " "))
	select {} // until the parent kills us
}

// cpuTime is the user+system CPU time of this process (all threads).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		fail("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench/metrics: "+format+"\n", args...)
	os.Exit(1)
}
