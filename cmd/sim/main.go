// Command sim runs simulated model-server pods (vLLM, SGLang, TensorRT-LLM) on loopback for
// the demo, end-to-end tests and benchmarks: one pod from flags, or several from a YAML file.
// It prints one JSON line per pod once it listens, and stops on SIGINT/SIGTERM. It only
// parses flags and the file and starts internal/sim pods; it must not simulate anything itself.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"sigs.k8s.io/yaml"

	"github.com/tandem-epp/tandem/internal/sim"
	"github.com/tandem-epp/tandem/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, errCrashed):
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(3)
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(2)
	}
}

var errCrashed = errors.New("a pod crashed (POST /sim/crash)")

// podLine is what sim prints for each pod it started.
type podLine struct {
	Name        string `json:"name"`
	Engine      string `json:"engine"`
	Role        string `json:"role"`
	Model       string `json:"model"`
	URL         string `json:"url"`
	HostPort    string `json:"host_port"`
	KVHostPort  string `json:"kv_host_port"` // SGLang bootstrap server, vLLM side channel, TRT ctx_info_endpoint
	MetricsPath string `json:"metrics_path"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "YAML file with `pods: [...]` (PodConfig fields in snake_case); replaces the single-pod flags")
	exitOnCrash := fs.Bool("exit-on-crash", true, "exit with status 3 when a pod crashes, as a real engine process would")
	verbose := fs.Bool("v", false, "log to stderr")
	showVersion := fs.Bool("version", false, "print the version, commit and Go version, then exit")
	// -profile picks the parameter set the other model flags start from, so it is read first.
	profile := profileArg(args)
	mk, ok := sim.Profiles[profile]
	if !ok {
		return fmt.Errorf("-profile %q: unknown; valid: %s", profile, strings.Join(profileNames(), ", "))
	}
	fs.String("profile", "default", "engine model the other model flags start from: "+strings.Join(profileNames(), ", "))
	cfg := sim.PodConfig{Params: mk()}
	fs.StringVar(&cfg.Name, "name", "", "pod name (default engine-role-port)")
	fs.StringVar(&cfg.Engine, "engine", sim.EngineVLLM, "vllm, sglang or trtllm")
	fs.StringVar(&cfg.Role, "role", "", "prefill, decode or empty for a standard pod")
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:8000", "serving address")
	fs.StringVar(&cfg.KVAddr, "kv-addr", "127.0.0.1:0", "KV side channel address (the SGLang bootstrap port)")
	fs.StringVar(&cfg.Model, "model", "sim-model", "served model name")
	fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "multiply every model time by this (0.01 = 100× faster)")
	fs.BoolVar(&cfg.RoutingSidecar, "routing-sidecar", false, "vLLM decode pod: run the prefill leg named by x-prefiller-host-port (llm-d NIXL v2)")
	fs.BoolVar(&cfg.AnyRole, "any-role", false, "accept any PD leg whatever the role")
	fs.BoolVar(&cfg.TRTParamsTopLevel, "trt-params-top-level", false, "TensorRT-LLM: disaggregated_params at the top level of a context answer")
	fs.StringVar(&cfg.TRTServerInfo, "trt-server-info", "", "TensorRT-LLM: raw JSON to serve at /server_info")
	fs.StringVar(&cfg.KVFormat, "kv-format", "", "KV layout the pod produces and accepts (its revision); a decode leg of another format cannot load the KV")
	fs.StringVar(&cfg.KVLoadFailurePolicy, "kv-load-failure-policy", "", "vLLM decode pod whose KV load fails: recompute (prefill locally, answer 200) or fail (default)")
	p := &cfg.Params
	fs.Float64Var(&p.PrefillBase, "prefill-base-seconds", p.PrefillBase, "fixed cost per prompt, paid with its first chunk")
	fs.Float64Var(&p.PrefillPerToken, "prefill-per-token-seconds", p.PrefillPerToken, "iteration compute time: per token computed")
	fs.Float64Var(&p.PrefillQuadratic, "prefill-quadratic-seconds", p.PrefillQuadratic, "iteration compute time: attention, per unit of (done+n)²−done²")
	fs.Float64Var(&p.DecodeBase, "decode-base-seconds", p.DecodeBase, "iteration memory time: reading the weights")
	fs.Float64Var(&p.DecodePerSeq, "decode-per-seq-seconds", p.DecodePerSeq, "iteration memory time: per scheduled sequence")
	fs.Float64Var(&p.DecodePerKVToken, "decode-per-kv-token-seconds", p.DecodePerKVToken, "iteration memory time: per token of KV the scheduled sequences attend to")
	fs.IntVar(&p.MaxBatchedTokens, "max-batched-tokens", p.MaxBatchedTokens, "token budget of one iteration (vLLM max_num_batched_tokens); 0: none")
	fs.Float64Var(&p.TransferBase, "transfer-base-seconds", p.TransferBase, "KV transfer: constant term")
	fs.Float64Var(&p.TransferPerToken, "transfer-per-token-seconds", p.TransferPerToken, "KV transfer: per token")
	fs.IntVar(&p.MaxRunning, "max-running", p.MaxRunning, "running batch size; more requests wait")
	fs.IntVar(&p.PrefillLanes, "prefill-lanes", p.PrefillLanes, "most prompts one iteration prefills; 0: as many as the budget fits")
	fs.IntVar(&p.KVTokens, "kv-tokens", p.KVTokens, "KV capacity in tokens")
	fs.IntVar(&p.BlockSize, "block-size", p.BlockSize, "KV and prefix-cache block size in tokens")
	fs.IntVar(&p.DefaultMaxTokens, "default-max-tokens", p.DefaultMaxTokens, "output tokens when a request sets no max_tokens")
	fs.Float64Var(&p.KVHold, "kv-hold-seconds", p.KVHold, "how long a prefill pod keeps KV for its decode leg")
	fs.Float64Var(&p.BootstrapTimeout, "bootstrap-timeout-seconds", p.BootstrapTimeout, "SGLang rendezvous / TRT generation-first wait")
	f := &cfg.Faults
	fs.Float64Var(&f.ErrorRate, "error-rate", 0, "fraction of requests answered with --error-status")
	fs.IntVar(&f.ErrorStatus, "error-status", 500, "status of injected errors")
	fs.BoolVar(&f.HangBeforeFirstToken, "hang-before-first-token", false, "never send the first token")
	fs.IntVar(&f.HangAfterTokens, "hang-after-tokens", 0, "stall after this many tokens (0: never)")
	fs.Float64Var(&f.SlowStart, "slow-start-seconds", 0, "wall seconds before the response headers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *showVersion {
		_, err := fmt.Fprintln(stdout, version.Line("sim"))
		return err
	}
	pods := []sim.PodConfig{cfg}
	if *config != "" {
		var err error
		if pods, err = loadConfig(*config); err != nil {
			return err
		}
	}
	log := slog.New(slog.DiscardHandler)
	if *verbose {
		log = slog.New(slog.NewTextHandler(stderr, nil))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	crashed := make(chan string, len(pods))
	enc := json.NewEncoder(stdout)
	for _, pc := range pods {
		pc.Logger = log
		s, err := sim.Start(ctx, pc)
		if err != nil {
			return err
		}
		defer s.Close()
		c := s.Config()
		if err := enc.Encode(podLine{Name: c.Name, Engine: c.Engine, Role: c.Role, Model: c.Model, URL: s.URL(),
			HostPort: s.HostPort(), KVHostPort: s.KVHostPort(), MetricsPath: s.MetricsPath()}); err != nil {
			return err
		}
		go func() {
			select {
			case <-s.Crashed():
				crashed <- c.Name
			case <-ctx.Done():
			}
		}()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case name := <-crashed:
			if *exitOnCrash {
				return fmt.Errorf("pod %s: %w", name, errCrashed)
			}
		}
	}
}

// profileArg is the value of -profile (or --profile) in args, "default" without one.
func profileArg(args []string) string {
	for i, a := range args {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "profile" {
			continue
		}
		if hasVal {
			return val
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return "default"
}

func profileNames() []string {
	var ns []string
	for n := range sim.Profiles {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return ns
}

// loadConfig reads `pods:` from YAML. Each pod starts from DefaultParams, model sim-model and
// address 127.0.0.1:0, so a file names only what it changes; unknown fields are errors
// naming the pod.
func loadConfig(path string) ([]sim.PodConfig, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var file struct {
		Pods []json.RawMessage `json:"pods"`
	}
	if err := strictJSON(js, &file); err != nil {
		return nil, fmt.Errorf("%s: %w (want a top-level \"pods\" list)", path, err)
	}
	if len(file.Pods) == 0 {
		return nil, fmt.Errorf("%s: pods is empty: list at least one pod", path)
	}
	pods := make([]sim.PodConfig, len(file.Pods))
	for i, pr := range file.Pods {
		pods[i] = sim.PodConfig{Params: sim.DefaultParams(), Addr: "127.0.0.1:0", Model: "sim-model"}
		if err := strictJSON(pr, &pods[i]); err != nil {
			return nil, fmt.Errorf("%s: pods[%d]: %w", path, i, err)
		}
	}
	return pods, nil
}

func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
