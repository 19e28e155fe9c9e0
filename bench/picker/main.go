// Command picker measures the full PD pick — strategy and profile resolution, prefix
// hashing of a 32 KiB prompt, prefix matching, the cascade (fast paths, scoring, pairing)
// and tracker registration — on pools of 16, 128 and 1024 endpoints, through the same
// Router the ext_proc server calls. Every pool is rolesets of 2 prefill + 2 decode pods with
// scraped metrics and live load; prompts share long prefixes so matching does real work.
//
// It first times, side by side in one run (picks interleaved, the order alternating), the
// pd strategy as it ships — the plugin chain — against the cascade it replaced, frozen in
// bench/picker/baseline, on the same pool, load and prompts; and at the end llm-d-router
// v0.10.0's pd-epp-config.yaml loaded as --config-file would load it. Each prompt is read
// just before its pick, as ext_proc's parse leaves it in the CPU cache (PICKER_COLD_PROMPTS=1:
// not). It ends with RESULT lines. Run
// with `make bench-picker` from the repository root. It is a measurement, not part of
// Tandem: it must not be imported, nor route through anything but the production Router.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"

	"github.com/tandem-epp/tandem/bench/picker/baseline"
	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/tokenize"
)

const promptBytes = 32 << 10

// llmdPDConfig is llm-d-router v0.10.0's deploy/config/pd-epp-config.yaml, as copied into
// the pd package's testdata.
const llmdPDConfig = "internal/pd/testdata/llm-d-router-v0.10.0/pd-epp-config.yaml"

type setup struct {
	router *picker.Router
	snap   *pool.Snapshot
	reqs   []*request.Request
}

// build assembles the pool and router; policy, when not empty, is the prefill score policy
// (the token-load policies are registered, with their decode policy token_load alongside).
// frozen builds the baseline cascade instead of the chain. seed fixes the pool's load and
// the prompts, so two builds with one seed route the same traffic over the same state.
func build(ctx context.Context, n int, seed uint64, policy string, frozen bool) setup {
	return buildWith(ctx, n, seed, policy, frozen, buildOpts{})
}

// buildPredictive is build with the pd-predictive strategy as the default: online latency
// models fed by the outcome of every pick (the runner reports each request's first byte and
// end), predicted TTFT and TPOT for every candidate, selective disaggregation and the
// standard-pod decider on every pick.
func buildPredictive(ctx context.Context, n int, seed uint64) setup {
	return buildWith(ctx, n, seed, "", false, buildOpts{predictive: true})
}

// bucketRanges are the prompt-length buckets of the bucketing runs, in tokens: roleset i
// serves bucketRanges[i%4] (a maximum of 0 is unlimited).
var bucketRanges = [][2]int{{0, 1023}, {1024, 2047}, {2048, 4095}, {4096, 0}}

// buildOpts vary build: ranges sets each roleset's routingConfig range (nil: no annotation)
// and turns bucketing on; predictive makes pd-predictive the default strategy; placed gives
// every pod a node of its own in one of two zones, as the Kubernetes source does (its node
// name as kubernetes.io/hostname), so topology-aware pairing weighs the pairs.
type buildOpts struct {
	ranges             [][2]int
	predictive, placed bool
	// models > 1 labels the rolesets with that many models in turn ("bench" first); the
	// requests are for "bench", so a pick reaches 1/models of the pool.
	models int
}

// buildWith is build varied by o.
func buildWith(ctx context.Context, n int, seed uint64, policy string, frozen bool, o buildOpts) setup {
	ranges, predictive := o.ranges, o.predictive
	rng := rand.New(rand.NewPCG(seed, 11))
	gw := config.DefaultPD()
	if policy != "" {
		gw.PrefillScorePolicy, gw.DecodeScorePolicy = policy, pd.PolicyTokenLoad
	}
	gw.PromptLengthBucketing = ranges != nil
	deps := picker.NewDeps(nil, gw.PrefixCache)
	deps.Warmer = prefix.NewWarmer(deps.Prefix, 4096)
	go deps.Warmer.Run(ctx)
	var strategies []picker.Strategy
	if frozen {
		c := baseline.New(baseline.Options{Deps: deps, Gateway: gw})
		strategies = []picker.Strategy{c, picker.NewRandom(deps), picker.NewLeastRequestStrategy(deps), picker.NewPrefixCache(deps, gw)}
	} else {
		var m *latency.Models
		if predictive {
			m = latency.New(latency.Options{Samples: deps.Metrics.Get})
			deps.Outcomes.Subscribe(m)
		}
		cascade := pd.New(pd.Options{Deps: deps, Gateway: gw, Models: m, TokenLoad: pd.NewTokenLoad(gw, ledger.Options{})})
		strategies = pd.Strategies(cascade, deps, gw)
	}
	def := pd.StrategyName
	if predictive {
		def = pd.StrategyPredictive
	}
	res, err := config.NewResolver(config.Gateway{PD: gw, DefaultStrategy: def}, config.Options{})
	if err != nil {
		fail(err)
	}
	router, err := picker.NewRouter(picker.RouterOptions{Resolver: res, Strategies: strategies})
	if err != nil {
		fail(err)
	}
	eps := make([]*pool.Endpoint, n)
	for i := range eps {
		role := "prefill"
		if i%4 >= 2 {
			role = "decode"
		}
		model := "bench"
		if o.models > 1 && (i/4)%o.models > 0 {
			model = fmt.Sprintf("other-%d", (i/4)%o.models)
		}
		labels := map[string]string{pool.LabelModelName: model, pool.LabelRoleName: role,
			pool.LabelRolesetName: fmt.Sprintf("rs-%d", i/4)}
		if o.placed {
			labels[config.LabelHostname] = fmt.Sprintf("node-%d", i)
			labels[config.LabelZone] = fmt.Sprintf("zone-%d", i%2)
		}
		var ann map[string]string
		if ranges != nil {
			r := ranges[(i/4)%len(ranges)]
			ann = map[string]string{pool.AnnotationConfig: fmt.Sprintf(
				`{"profiles":{"default":{"routingConfig":{"promptLenBucketMinLength":%d,"promptLenBucketMaxLength":%d}}}}`, r[0], r[1])}
		}
		eps[i] = pool.NewEndpoint("bench", fmt.Sprintf("pod-%d", i), fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250), 8000, 0, labels, ann)
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
	return setup{router: router, snap: pool.NewStore().Publish(pool.Info{Name: "bench"}, eps, true), reqs: requests(rng)}
}

// requests are 16 shared 24 KiB prefixes, each request adding its own 8 KiB tail.
func requests(rng *rand.Rand) []*request.Request {
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
			fail(err)
		}
		reqs[i] = r
	}
	return reqs
}

// variedRequests are prompts of 1 to 32 KiB (log-uniform), sharing 16 prefixes of 512 bytes.
func variedRequests(rng *rand.Rand) []*request.Request {
	prefixes := make([]string, 16)
	for i := range prefixes {
		prefixes[i] = randomText(rng, 512)
	}
	reqs := make([]*request.Request, 256)
	for i := range reqs {
		n := int(math.Exp(math.Log(1<<10) + rng.Float64()*math.Log(32)))
		body, _ := json.Marshal(map[string]any{"model": "bench", "prompt": prefixes[i%len(prefixes)] + randomText(rng, n-512)})
		r, err := request.Parse("POST", "/v1/completions", map[string]string{}, body)
		if err != nil {
			fail(err)
		}
		reqs[i] = r
	}
	return reqs
}

// tokenizeCost is the cost of counting whole texts of the repository's docs with cl100k_base,
// in µs per KiB: Tandem's counter (median of 5 passes) and tiktoken-go's encoder (one pass).
func tokenizeCost() (tandem, tiktokenGo float64) {
	files, _ := filepath.Glob("docs/*.md")
	files = append(files, "README.md")
	var texts []string
	size := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fail(fmt.Errorf("%w (run from the repository root: make bench-picker)", err))
		}
		texts, size = append(texts, string(b)), size+len(b)
	}
	if err := tokenize.Load(); err != nil {
		fail(err)
	}
	kib := float64(size) / 1024
	var passes []float64
	for range 5 {
		t0 := time.Now()
		for _, s := range texts {
			if _, _, err := tokenize.Count(s, 0); err != nil {
				fail(err)
			}
		}
		passes = append(passes, usf(time.Since(t0))/kib)
	}
	slices.Sort(passes)
	tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader())
	enc, err := tiktoken.GetEncoding("cl100k_base")
	if err != nil {
		fail(err)
	}
	t0 := time.Now()
	for _, s := range texts {
		enc.EncodeOrdinary(s)
	}
	return passes[2], usf(time.Since(t0)) / kib
}

// buildLLMD loads llm-d's PD config as cmd/epp does, over n endpoints labelled llm-d.ai/role
// (half prefill, half decode, no rolesets) with scraped queues.
func buildLLMD(ctx context.Context, n int, seed uint64) setup {
	rng := rand.New(rand.NewPCG(seed, 11))
	data, err := os.ReadFile(llmdPDConfig)
	if err != nil {
		fail(fmt.Errorf("%w (run from the repository root: make bench-picker)", err))
	}
	f, err := config.ParseFile(llmdPDConfig, data, config.FileOptions{KnownPluginTypes: pd.IsPluginType})
	if err != nil {
		fail(err)
	}
	gw, _, err := config.Load(f, func(string) string { return "" })
	if err != nil {
		fail(err)
	}
	p, err := app.BuildPicker(app.PickerOptions{Gateway: gw, File: f, Logger: logr.Discard()})
	if err != nil {
		fail(err)
	}
	go p.Deps.Warmer.Run(ctx)
	eps := make([]*pool.Endpoint, n)
	for i := range eps {
		role := "prefill"
		if i%2 == 1 {
			role = "decode"
		}
		eps[i] = pool.NewEndpoint("bench", fmt.Sprintf("pod-%d", i), fmt.Sprintf("127.1.%d.%d", 1+i/250, 1+i%250), 8000, 0,
			map[string]string{pool.LabelModelName: "bench", pool.LabelLLMDRole: role}, nil)
		p.Deps.Metrics.Put(eps[i].Key(), &metrics.Sample{Waiting: float64(rng.IntN(8)), HasWaiting: true,
			KVUsage: rng.Float64() * 0.8, HasKVUsage: true, UpdatedAt: time.Now()})
	}
	return setup{router: p.Router, snap: pool.NewStore().Publish(pool.Info{Name: "bench"}, eps, true), reqs: requests(rng)}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func randomText(rng *rand.Rand, n int) string {
	words := []string{"prefill ", "decode ", "roleset ", "cache ", "token ", "gateway ", "pool ", "score "}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()[:n]
}

// coldPrompts (PICKER_COLD_PROMPTS=1) leaves each prompt where setup left it, most likely out
// of the CPU caches (256 prompts of 32 KiB), instead of reading it just before the pick.
var coldPrompts = os.Getenv("PICKER_COLD_PROMPTS") == "1"

// warmPrompt reads a cache line of every 64 bytes of the prompt, as ext_proc's parse does
// just before it picks (it scans the body and copies the prompt out of it): the pick then
// hashes a prompt in the cache, as in Tandem, not one evicted since the setup parsed it.
func warmPrompt(p string) {
	var sum byte
	for i := 0; i < len(p); i += 64 {
		sum += p[i]
	}
	runtime.KeepAlive(sum) // the reads must happen
}

// runner picks on one setup, completing each request after the next pick (so one request
// is always in flight).
type runner struct {
	s    setup
	prev *picker.Decision
	i    int
}

func (r *runner) pick(ctx context.Context) time.Duration {
	req := r.s.reqs[r.i%len(r.s.reqs)]
	r.i++
	if !coldPrompts {
		warmPrompt(req.Prompt)
	}
	t0 := time.Now()
	d, err := r.s.router.Schedule(ctx, req, r.s.snap, r.s.snap.OfModel(req.Model)) // as ext_proc narrows it
	took := time.Since(t0)
	if err != nil {
		fail(fmt.Errorf("pick: %w", err))
	}
	if r.prev != nil {
		r.prev.Lifecycle.ResponseHeaders(200, nil)
		r.prev.Lifecycle.ResponseBody(64, false)
		r.prev.Lifecycle.Done(nil)
	}
	r.prev = d
	return took
}

// run picks iters times and returns the per-pick latencies and mallocs per pick.
func run(ctx context.Context, s setup, iters int) ([]time.Duration, float64) {
	r := &runner{s: s}
	lat := make([]time.Duration, iters)
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	for i := range iters {
		lat[i] = r.pick(ctx)
	}
	runtime.ReadMemStats(&ms1)
	r.prev.Lifecycle.Done(nil)
	return lat, float64(ms1.Mallocs-ms0.Mallocs) / float64(iters)
}

// interleave picks iters times on each of a and b, alternating which goes first, so both
// see the same machine at the same moments, and returns their latencies.
func interleave(ctx context.Context, a, b *runner, iters int) (la, lb []time.Duration) {
	la, lb = make([]time.Duration, iters), make([]time.Duration, iters)
	for i := range iters {
		if i%2 == 0 {
			la[i] = a.pick(ctx)
			lb[i] = b.pick(ctx)
		} else {
			lb[i] = b.pick(ctx)
			la[i] = a.pick(ctx)
		}
	}
	return la, lb
}

func pct(lat []time.Duration, p float64) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Nanoseconds())/1000) }

func usf(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

// sideBySide times a against b: picks interleaved (the order alternating) on one locked
// thread, warm picks of each first, then 5 rounds of n, each after a GC; it returns every
// timed pick of each and the median of the rounds' p50 ratios a/b (one round's can be skewed
// by another process taking the CPU for a while).
func sideBySide(ctx context.Context, a, b *runner, warm, n int) (ta, tb []time.Duration, ratio float64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	interleave(ctx, a, b, warm)
	var ratios []float64
	for range 5 {
		runtime.GC()
		x, y := interleave(ctx, a, b, n)
		ta, tb = append(ta, x...), append(tb, y...)
		ratios = append(ratios, usf(pct(x, 0.5))/usf(pct(y, 0.5)))
	}
	a.prev.Lifecycle.Done(nil)
	b.prev.Lifecycle.Done(nil)
	slices.Sort(ratios)
	return ta, tb, ratios[len(ratios)/2]
}

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if path := os.Getenv("PICKER_PROFILE_PREDICTIVE"); path != "" {
		profilePredictive(ctx, path)
		return
	}
	fmt.Printf("bench-picker: full PD pick, %d-byte prompts, GOMAXPROCS=%d\n", promptBytes, runtime.GOMAXPROCS(0))
	// The chain against the cascade it replaced: same pool, load and prompts, picks
	// interleaved (the order alternating) on one locked thread, before anything else has
	// grown the heap; 5 rounds, the ratio the median of the rounds' p50 ratios (one round's can
	// be skewed by another process taking the CPU for a while).
	// The chain against the cascade it replaced: same pool, load and prompts, before anything
	// else has grown the heap.
	chain, cascade, ratio := sideBySide(ctx, &runner{s: build(ctx, 128, 42, "", false)}, &runner{s: build(ctx, 128, 42, "", true)}, 2000, 4000)
	cp50, kp50 := pct(chain, 0.5), pct(cascade, 0.5)
	fmt.Printf("side by side, endpoints=128 picks=5×4000: chain p50=%sµs p99=%sµs, cascade (baseline) p50=%sµs p99=%sµs, median round ratio %.3f\n",
		us(cp50), us(pct(chain, 0.99)), us(kp50), us(pct(cascade, 0.99)), ratio)
	fmt.Printf("RESULT pick_p50_us_128_chain=%.1f\n", usf(cp50))
	fmt.Printf("RESULT pick_p50_us_128_cascade=%.1f\n", usf(kp50))
	fmt.Printf("RESULT pick_ratio_chain_vs_cascade_128=%.3f\n", ratio)

	// pd-predictive beside the default pd pick, the same way: same pool, load and prompts.
	pred, def, ratio := sideBySide(ctx, &runner{s: buildPredictive(ctx, 128, 42)}, &runner{s: build(ctx, 128, 42, "", false)}, 2000, 4000)
	fmt.Printf("side by side, endpoints=128 picks=5×4000: pd-predictive p50=%sµs p99=%sµs, pd p50=%sµs p99=%sµs, median round ratio %.3f\n",
		us(pct(pred, 0.5)), us(pct(pred, 0.99)), us(pct(def, 0.5)), us(pct(def, 0.99)), ratio)
	fmt.Printf("RESULT pick_p50_us_128_predictive=%.1f\n", usf(pct(pred, 0.5)))
	fmt.Printf("RESULT pick_p50_us_128_default_beside_predictive=%.1f\n", usf(pct(def, 0.5)))
	fmt.Printf("RESULT pick_ratio_predictive_vs_default_128=%.3f\n", ratio)

	// Prompt-length bucketing against the default pick, side by side in the same way, on the
	// same traffic: prompts of 1 to 32 KiB over rolesets bucketed at 1024, 2048 and 4096 tokens.
	// A prompt is tokenized only while a boundary lies within what its bytes could hold.
	bucketR, plainR := &runner{s: buildWith(ctx, 128, 44, "", false, buildOpts{ranges: bucketRanges})}, &runner{s: build(ctx, 128, 44, "", false)}
	varied := variedRequests(rand.New(rand.NewPCG(45, 1)))
	plainR.s.reqs, bucketR.s.reqs = varied, varied
	bucketed, plain, bratio := sideBySide(ctx, bucketR, plainR, 1000, 2000)
	fmt.Printf("side by side, endpoints=128, prompts 1-32 KiB, picks=5×2000: default p50=%sµs p99=%sµs, bucketing p50=%sµs p99=%sµs, median round ratio %.3f\n",
		us(pct(plain, 0.5)), us(pct(plain, 0.99)), us(pct(bucketed, 0.5)), us(pct(bucketed, 0.99)), bratio)
	fmt.Printf("RESULT pick_p50_us_128_varied=%.1f\n", usf(pct(plain, 0.5)))
	fmt.Printf("RESULT pick_p50_us_128_bucketing=%.1f\n", usf(pct(bucketed, 0.5)))
	fmt.Printf("RESULT pick_ratio_bucketing_vs_default_128=%.3f\n", bratio)
	// Topology-aware pairing on pods placed on nodes in two zones (every pod on Kubernetes has
	// a node) against the same pool unplaced, where the pair step runs as before.
	for _, pr := range []bool{false, true} {
		name := "pd"
		if pr {
			name = "predictive"
		}
		placedR := &runner{s: buildWith(ctx, 128, 42, "", false, buildOpts{predictive: pr, placed: true})}
		unplacedR := &runner{s: buildWith(ctx, 128, 42, "", false, buildOpts{predictive: pr})}
		placed, unplaced, tratio := sideBySide(ctx, placedR, unplacedR, 2000, 4000)
		fmt.Printf("side by side, endpoints=128 picks=5×4000, %s: placed on nodes in two zones p50=%sµs p99=%sµs, unplaced p50=%sµs p99=%sµs, median round ratio %.3f\n",
			name, us(pct(placed, 0.5)), us(pct(placed, 0.99)), us(pct(unplaced, 0.5)), us(pct(unplaced, 0.99)), tratio)
		fmt.Printf("RESULT pick_ratio_topology_vs_unplaced_128_%s=%.3f\n", name, tratio)
	}

	// A pool of four models, 1024 endpoints, against a pool of the request's model alone with
	// as many pods of it (256): a pick reaches its model's pods only, and costs what it would
	// on a pool of them alone.
	multiR, aloneR := &runner{s: buildWith(ctx, 1024, 46, "", false, buildOpts{models: 4})}, &runner{s: build(ctx, 256, 46, "", false)}
	multi, alone, mratio := sideBySide(ctx, multiR, aloneR, 1000, 2000)
	fmt.Printf("side by side, picks=5×2000: 4 models × 256 endpoints p50=%sµs p99=%sµs, 256 endpoints of one model p50=%sµs p99=%sµs, median round ratio %.3f\n",
		us(pct(multi, 0.5)), us(pct(multi, 0.99)), us(pct(alone, 0.5)), us(pct(alone, 0.99)), mratio)
	fmt.Printf("RESULT pick_ratio_four_models_vs_one_256=%.3f\n", mratio)

	tk, tg := tokenizeCost()
	fmt.Printf("cl100k_base over docs/*.md and README.md: Tandem %.1fµs/KiB, tiktoken-go %.1fµs/KiB (%.0f× faster)\n", tk, tg, tg/tk)
	fmt.Printf("RESULT tokenize_us_per_kib=%.1f\n", tk)
	fmt.Printf("RESULT tokenize_us_per_kib_tiktoken_go=%.1f\n", tg)

	results := map[int][2]float64{}
	for i, n := range []int{16, 128, 1024} {
		// Each setup's warmer stops with its context, so its pool and index are garbage
		// before the next setup is timed (a live 1024-endpoint index would slow every GC).
		sctx, stop := context.WithCancel(ctx)
		s := build(sctx, n, uint64(7+i), "", false)
		iters := 4000
		if n == 1024 {
			iters = 1500
		}
		run(ctx, s, iters/4) // warm the prefix index and the caches
		lat, allocs := run(ctx, s, iters)
		p50, p99 := pct(lat, 0.5), pct(lat, 0.99)
		fmt.Printf("endpoints=%-5d picks=%d p50=%sµs p90=%sµs p99=%sµs allocs/pick=%.0f\n",
			n, iters, us(p50), us(pct(lat, 0.9)), us(p99), allocs)
		results[n] = [2]float64{usf(p50), allocs}
		stop()
	}
	fmt.Printf("growth 128→1024: %.1f× the time for 8× the endpoints\n", results[1024][0]/results[128][0])
	fmt.Printf("RESULT pick_p50_us_16=%.1f\n", results[16][0])
	fmt.Printf("RESULT pick_p50_us_128=%.1f\n", results[128][0])
	fmt.Printf("RESULT pick_p50_us_1024=%.1f\n", results[1024][0])
	fmt.Printf("RESULT allocs_per_pick_128=%.0f\n", results[128][1])
	// The token-load policies (decode token_load too) on 128 endpoints: ledger reads in the
	// scoring, charges in the critical section, releases on completion.
	for i, pol := range []struct{ name, result string }{{pd.PolicyTokenLoad, "token_load"}, {pd.PolicyHybridCacheLoad, "hybrid"}} {
		sctx, stop := context.WithCancel(ctx)
		s := build(sctx, 128, uint64(20+i), pol.name, false)
		run(ctx, s, 1000)
		lat, allocs := run(ctx, s, 4000)
		fmt.Printf("policy=%s endpoints=128 p50=%sµs p99=%sµs allocs/pick=%.0f\n", pol.name, us(pct(lat, 0.5)), us(pct(lat, 0.99)), allocs)
		fmt.Printf("RESULT pick_p50_us_128_%s=%.1f\n", pol.result, usf(pct(lat, 0.5)))
		stop()
	}

	// llm-d's PD config: approx prefix producer, prefix and queue scorers on both profiles,
	// the prefix-based decider.
	l := buildLLMD(ctx, 128, 43)
	run(ctx, l, 1000)
	lat, allocs := run(ctx, l, 4000)
	fmt.Printf("llm-d pd-epp-config.yaml endpoints=128 p50=%sµs p99=%sµs allocs/pick=%.0f\n", us(pct(lat, 0.5)), us(pct(lat, 0.99)), allocs)
	fmt.Printf("RESULT pick_p50_us_128_llmd_pd=%.1f\n", usf(pct(lat, 0.5)))
}

// profilePredictive writes a CPU profile of pd-predictive picks on 128 endpoints to path
// (PICKER_PROFILE_PREDICTIVE=path), for work on the pick's cost.
func profilePredictive(ctx context.Context, path string) {
	r := &runner{s: buildPredictive(ctx, 128, 42)}
	for range 2000 {
		r.pick(ctx)
	}
	f, err := os.Create(path)
	if err != nil {
		fail(err)
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		fail(err)
	}
	for range 20000 {
		r.pick(ctx)
	}
	pprof.StopCPUProfile()
}
