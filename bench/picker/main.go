// Command picker measures the full PD pick — strategy and profile resolution, prefix
// hashing of a 32 KiB prompt, prefix matching, the cascade (fast paths, scoring, pairing)
// and tracker registration — on pools of 16, 128 and 1024 endpoints, through the same
// Router the ext_proc server calls. Every pool is rolesets of 2 prefill + 2 decode pods with
// scraped metrics and live load; prompts share long prefixes so matching does real work.
// It ends with RESULT lines. Run with `make bench-picker`. It is a measurement, not part of
// Tandem: it must not be imported, nor route through anything but the production Router.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
	"github.com/tandem-epp/tandem/internal/request"
)

const promptBytes = 32 << 10

type setup struct {
	router *picker.Router
	snap   *pool.Snapshot
	reqs   []*request.Request
}

// build assembles the pool and router; policy, when not empty, is the prefill score policy
// (the token-load policies are registered, with their decode policy token_load alongside).
func build(ctx context.Context, n int, rng *rand.Rand, policy string) setup {
	gw := config.DefaultPD()
	if policy != "" {
		gw.PrefillScorePolicy, gw.DecodeScorePolicy = policy, pd.PolicyTokenLoad
	}
	deps := picker.NewDeps(nil, gw.PrefixCache)
	deps.Warmer = prefix.NewWarmer(deps.Prefix, 4096)
	go deps.Warmer.Run(ctx)
	cascade := pd.New(pd.Options{Deps: deps, Gateway: gw})
	pd.RegisterTokenLoad(cascade, pd.NewTokenLoad(gw, ledger.Options{}))
	res, err := config.NewResolver(config.Gateway{PD: gw, DefaultStrategy: pd.StrategyName}, config.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	router, err := picker.NewRouter(picker.RouterOptions{Resolver: res, Strategies: pd.Strategies(cascade, deps, gw)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	eps := make([]*pool.Endpoint, n)
	for i := range eps {
		role := "prefill"
		if i%4 >= 2 {
			role = "decode"
		}
		labels := map[string]string{pool.LabelModelName: "bench", pool.LabelRoleName: role,
			pool.LabelRolesetName: fmt.Sprintf("rs-%d", i/4)}
		eps[i] = pool.NewEndpoint("bench", fmt.Sprintf("pod-%d", i), fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250), 8000, 0, labels, nil)
		if role == "decode" {
			deps.Metrics.Put(eps[i].Key(), &metrics.Sample{
				Running: float64(rng.IntN(20)), HasRunning: true, KVUsage: rng.Float64() * 0.8, HasKVUsage: true,
				GenThroughput: 500 + rng.Float64()*1000, HasGenThroughput: true, UpdatedAt: time.Now()})
			// Some live load so every policy input is non-trivial.
			for range rng.IntN(4) {
				deps.Running.Start(eps[i].Key())
			}
		}
	}
	snap := pool.NewStore().Publish(pool.Info{Name: "bench"}, eps, true)

	// 16 shared 24 KiB prefixes, each request adding its own 8 KiB tail.
	prefixes := make([]string, 16)
	for i := range prefixes {
		prefixes[i] = randomText(rng, 24<<10)
	}
	reqs := make([]*request.Request, 256)
	for i := range reqs {
		text := prefixes[i%len(prefixes)] + randomText(rng, promptBytes-24<<10)
		body, _ := json.Marshal(map[string]any{"model": "bench", "prompt": text})
		r, err := request.Parse("POST", "/v1/completions", map[string]string{}, body)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		reqs[i] = r
	}
	return setup{router: router, snap: snap, reqs: reqs}
}

func randomText(rng *rand.Rand, n int) string {
	words := []string{"prefill ", "decode ", "roleset ", "cache ", "token ", "gateway ", "pool ", "score "}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()[:n]
}

// run picks iters times (completing each request after the next pick, so one request is
// always in flight) and returns the per-pick latencies and mallocs per pick.
func run(ctx context.Context, s setup, iters int) ([]time.Duration, float64) {
	lat := make([]time.Duration, iters)
	var prev *picker.Decision
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	for i := range iters {
		req := s.reqs[i%len(s.reqs)]
		t0 := time.Now()
		d, err := s.router.Schedule(ctx, req, s.snap, s.snap.Endpoints)
		lat[i] = time.Since(t0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "pick:", err)
			os.Exit(1)
		}
		if prev != nil {
			prev.Lifecycle.ResponseHeaders(200, "")
			prev.Lifecycle.Done(nil)
		}
		prev = d
	}
	runtime.ReadMemStats(&ms1)
	prev.Lifecycle.Done(nil)
	return lat, float64(ms1.Mallocs-ms0.Mallocs) / float64(iters)
}

func pct(lat []time.Duration, p float64) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Nanoseconds())/1000) }

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rng := rand.New(rand.NewPCG(7, 11))
	fmt.Printf("bench-picker: full PD pick, %d-byte prompts, GOMAXPROCS=%d\n", promptBytes, runtime.GOMAXPROCS(0))
	results := map[int][2]float64{}
	for _, n := range []int{16, 128, 1024} {
		s := build(ctx, n, rng, "")
		iters := 4000
		if n == 1024 {
			iters = 1500
		}
		run(ctx, s, iters/4) // warm the prefix index and the caches
		lat, allocs := run(ctx, s, iters)
		p50, p99 := pct(lat, 0.5), pct(lat, 0.99)
		fmt.Printf("endpoints=%-5d picks=%d p50=%sµs p90=%sµs p99=%sµs allocs/pick=%.0f\n",
			n, iters, us(p50), us(pct(lat, 0.9)), us(p99), allocs)
		results[n] = [2]float64{float64(p50.Nanoseconds()) / 1000, allocs}
	}
	fmt.Printf("growth 128→1024: %.1f× the time for 8× the endpoints\n", results[1024][0]/results[128][0])
	fmt.Printf("RESULT pick_p50_us_16=%.1f\n", results[16][0])
	fmt.Printf("RESULT pick_p50_us_128=%.1f\n", results[128][0])
	fmt.Printf("RESULT pick_p50_us_1024=%.1f\n", results[1024][0])
	fmt.Printf("RESULT allocs_per_pick_128=%.0f\n", results[128][1])
	// The token-load policies (decode token_load too) on 128 endpoints: ledger reads in the
	// scoring, charges in the critical section, releases on completion.
	for _, pol := range []struct{ name, result string }{{pd.PolicyTokenLoad, "token_load"}, {pd.PolicyHybridCacheLoad, "hybrid"}} {
		s := build(ctx, 128, rng, pol.name)
		run(ctx, s, 1000)
		lat, allocs := run(ctx, s, 4000)
		fmt.Printf("policy=%s endpoints=128 p50=%sµs p99=%sµs allocs/pick=%.0f\n", pol.name, us(pct(lat, 0.5)), us(pct(lat, 0.99)), allocs)
		fmt.Printf("RESULT pick_p50_us_128_%s=%.1f\n", pol.result, float64(pct(lat, 0.5).Nanoseconds())/1000)
	}
}
