package launch

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tandem-epp/tandem/internal/demo/workload"
	"github.com/tandem-epp/tandem/traces"
)

// Flags is the demo's command line. cmd/demo and the runner it starts parse the same one.
type Flags struct {
	Data        string // directory of the traces; "" means the ones in the repository (traces/)
	Mix         workload.Mix
	TimeScale   float64
	Listen      string
	EPPBinary   string
	Handoff     string
	EngineCheck bool
	Stay        bool
	Version     bool
	// BrokenDecode is the decode pod whose KV connector breaks during the replay ("" or
	// "none": every pod stays healthy); BreakAt is when, as a fraction of the window.
	BrokenDecode string
	BreakAt      float64
}

// DecodePods are the demo's decode pods, one per roleset (internal/demo's stack).
var DecodePods = []string{"decode-a", "decode-b"}

// ErrHelp is returned by Parse when -h or --help was asked for (usage already printed).
var ErrHelp = flag.ErrHelp

// Parse reads and checks the demo's flags. Every error names the flag and what it accepts.
func Parse(args []string, out io.Writer) (*Flags, error) {
	f := &Flags{}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, `Tandem demo: simulated prefill/decode/standard pods, Tandem and a local gateway on 127.0.0.1,
a slice of real traces replayed through them, then a summary per pod role. Partway through, one
decode pod's KV connector breaks silently (--broken-decode): the summary shows Tandem catching it.

Usage: make demo [ARGS='flags']   or   go run ./cmd/demo [flags]

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&f.Data, "data", "", "directory holding "+traces.AzureConv+", "+traces.AzureCode+" and "+traces.Mooncake+" (default: the traces shipped in the repository, traces/)")
	fs.IntVar(&f.Mix.Conv, "conv", 160, "requests from the Azure conversation trace")
	fs.IntVar(&f.Mix.Code, "code", 60, "requests from the Azure code trace")
	fs.IntVar(&f.Mix.Mooncake, "mooncake", 40, "requests from the Mooncake trace (those sharing prefix blocks)")
	fs.DurationVar(&f.Mix.Window, "window", 40*time.Second, "arrivals of each trace are scaled into this span")
	fs.Float64Var(&f.TimeScale, "time-scale", 0.2, "simulated model time × this = wall time")
	fs.IntVar(&f.Mix.MaxPromptTokens, "max-prompt-tokens", 16384, "cap on a request's prompt tokens")
	fs.IntVar(&f.Mix.MaxOutputTokens, "max-output-tokens", 256, "cap on a request's output tokens")
	fs.StringVar(&f.Listen, "listen", "127.0.0.1:8080", "gateway address (a free port is used if taken)")
	fs.StringVar(&f.EPPBinary, "epp-binary", "", "Tandem binary to run (default: build ./cmd/epp)")
	fs.StringVar(&f.Handoff, "handoff", "", "PD hand-off: sidecar (the decode pod's llm-d-style sidecar runs the prefill leg) or epp (Tandem runs it); auto or empty keeps Tandem's default (TANDEM_PD_HANDOFF=auto: the sidecar hand-off, since the demo's decode pods declare their sidecar)")
	fs.BoolVar(&f.EngineCheck, "engine-check", true, "after the replay, run one vLLM, one SGLang and one TensorRT-LLM prefill/decode pair with the epp hand-off (Tandem runs the prefill leg)")
	fs.StringVar(&f.BrokenDecode, "broken-decode", "decode-b", "decode pod whose KV connector breaks silently during the replay (the simulator's recompute_kv fault: it recomputes every prompt and still answers 200), to show Tandem's transfer proof catching it and holding the pod out of PD work; none keeps every pod healthy")
	fs.Float64Var(&f.BreakAt, "break-at", 0.33, "when --broken-decode breaks, as a fraction of --window (0: broken from the start)")
	fs.BoolVar(&f.Stay, "stay", false, "keep everything up after the summary until Ctrl-C, to curl it by hand")
	fs.BoolVar(&f.Version, "version", false, "print the version, commit and Go version, then exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: all settings are flags (see -h)", fs.Args())
	}
	if f.Version {
		return f, nil
	}
	return f, f.check()
}

func (f *Flags) check() error {
	var errs []error
	switch f.Handoff {
	case "", "auto", "sidecar", "epp":
	default:
		errs = append(errs, fmt.Errorf("--handoff %q: want auto, sidecar or epp", f.Handoff))
	}
	switch {
	case f.BrokenDecode == "" || f.BrokenDecode == "none":
		f.BrokenDecode = ""
	case !slices.Contains(DecodePods, f.BrokenDecode):
		errs = append(errs, fmt.Errorf("--broken-decode %q: want one of the demo's decode pods (%s) or none", f.BrokenDecode, strings.Join(DecodePods, ", ")))
	}
	if f.BreakAt < 0 || f.BreakAt >= 1 {
		errs = append(errs, fmt.Errorf("--break-at=%g: want a fraction of --window in [0, 1), e.g. 0.33", f.BreakAt))
	}
	for name, n := range map[string]int{"--conv": f.Mix.Conv, "--code": f.Mix.Code, "--mooncake": f.Mix.Mooncake} {
		if n < 0 {
			errs = append(errs, fmt.Errorf("%s=%d: must be 0 or more", name, n))
		}
	}
	if f.Mix.Conv+f.Mix.Code+f.Mix.Mooncake == 0 {
		errs = append(errs, errors.New("the workload is empty: set --conv, --code or --mooncake above 0"))
	}
	if f.Mix.Window <= 0 {
		errs = append(errs, fmt.Errorf("--window=%s: must be positive", f.Mix.Window))
	}
	if f.TimeScale <= 0 || f.TimeScale > 10 {
		errs = append(errs, fmt.Errorf("--time-scale=%g: want a factor in (0, 10], e.g. 0.2", f.TimeScale))
	}
	if f.Mix.MaxPromptTokens < 1 || f.Mix.MaxOutputTokens < 1 {
		errs = append(errs, fmt.Errorf("--max-prompt-tokens=%d and --max-output-tokens=%d: must be positive", f.Mix.MaxPromptTokens, f.Mix.MaxOutputTokens))
	}
	if _, _, err := net.SplitHostPort(f.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: want host:port, e.g. 127.0.0.1:8080 (%w)", f.Listen, err))
	}
	if f.EPPBinary != "" {
		if st, err := os.Stat(f.EPPBinary); err != nil {
			errs = append(errs, fmt.Errorf("--epp-binary: %w", err))
		} else if st.IsDir() || st.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("--epp-binary %s: not an executable file", f.EPPBinary))
		}
	}
	return errors.Join(errs...)
}

// Workload reads the traces (the embedded ones or --data) and builds the requests to replay.
func (f *Flags) Workload() ([]workload.Request, error) {
	fsys, err := traces.Open(f.Data, f.Mix.Files()...)
	if err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	reqs, err := workload.Load(fsys, f.Mix)
	if err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, errors.New("the workload is empty: the traces hold no request for this mix")
	}
	return reqs, nil
}

// TracesName says where the traces come from, for the user.
func (f *Flags) TracesName() string {
	if f.Data == "" {
		return "the traces in the repository (traces/)"
	}
	return f.Data
}

// EPPEnv is the environment the flags add to Tandem's (the hand-off).
func (f *Flags) EPPEnv() map[string]string {
	env := map[string]string{}
	if f.Handoff != "" {
		env["TANDEM_PD_HANDOFF"] = f.Handoff
	}
	return env
}
