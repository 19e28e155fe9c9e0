// Command demo is the one-command demo (`make demo`): simulated prefill, decode and standard
// pods, Tandem with a file-sourced pool and the local gateway, all on 127.0.0.1, a slice of
// real traces replayed through them, then a summary. Ctrl-C stops everything. It only parses
// flags and runs internal/demo; it must not hold demo logic of its own.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tandem-epp/tandem/internal/demo"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	data := fs.String("data", "", "directory of the traces (default: ../shared/data from the repository root)")
	conv := fs.Int("conv", 160, "requests from the Azure conversation trace")
	code := fs.Int("code", 60, "requests from the Azure code trace")
	mooncake := fs.Int("mooncake", 40, "requests from the Mooncake trace (those sharing prefix blocks)")
	window := fs.Duration("window", 40*time.Second, "arrivals of each trace are scaled into this span")
	scale := fs.Float64("time-scale", 0.2, "simulated model time × this = wall time")
	maxPrompt := fs.Int("max-prompt-tokens", 16384, "cap on a request's prompt tokens")
	maxOutput := fs.Int("max-output-tokens", 256, "cap on a request's output tokens")
	listen := fs.String("listen", "127.0.0.1:8080", "gateway address (a free port is used if taken)")
	eppBin := fs.String("epp-binary", "", "Tandem binary to run (default: build ./cmd/epp)")
	handoff := fs.String("handoff", "", "PD hand-off: sidecar (the decode pod's llm-d-style sidecar runs the prefill leg) or epp (Tandem runs it); auto or empty keeps Tandem's default (TANDEM_PD_HANDOFF=auto: the sidecar hand-off, since the demo's decode pods declare their sidecar)")
	engines := fs.Bool("engine-check", true, "after the replay, run one vLLM, one SGLang and one TensorRT-LLM prefill/decode pair with the epp hand-off (Tandem runs the prefill leg)")
	stay := fs.Bool("stay", false, "keep everything up after the summary until Ctrl-C, to curl it by hand")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: all settings are flags (see -h)", fs.Args())
	}
	env := map[string]string{}
	switch *handoff {
	case "":
	case "auto", "sidecar", "epp":
		env["TANDEM_PD_HANDOFF"] = *handoff
	default:
		return fmt.Errorf("--handoff %q: want auto, sidecar or epp", *handoff)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *data == "" {
		d, err := demo.FindDataDir()
		if err != nil {
			return err
		}
		*data = d
	}
	tmp, err := os.MkdirTemp("", "tandem-demo-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := *eppBin
	if bin == "" {
		root, err := demo.FindRepoRoot()
		if err != nil {
			return fmt.Errorf("%w; pass --epp-binary", err)
		}
		fmt.Fprintln(os.Stderr, "Building Tandem (./cmd/epp) …")
		if bin, err = demo.BuildEPP(ctx, root, tmp); err != nil {
			return err
		}
	}
	logPath := filepath.Join(os.TempDir(), "tandem-demo-epp.log")
	fmt.Fprintf(os.Stderr, "Tandem's log: %s\n", logPath)
	var engineCheck demo.EPPRunner
	if *engines {
		engineCheck = demo.ProcessEPP(bin, filepath.Join(os.TempDir(), "tandem-demo-engines-epp.log"), env)
	}
	return demo.Run(ctx, demo.Options{
		DataDir: *data,
		Mix: demo.Mix{Conv: *conv, Code: *code, Mooncake: *mooncake, Window: *window,
			MaxPromptTokens: *maxPrompt, MaxOutputTokens: *maxOutput},
		TimeScale: *scale, Listen: *listen, Stay: *stay,
		RunEPP: demo.ProcessEPP(bin, logPath, env), EngineCheckEPP: engineCheck, Out: os.Stdout, Progress: os.Stderr, ProgressTTY: isTerminal(os.Stderr),
	})
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
