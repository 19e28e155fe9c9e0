package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/demo/launch"
	"github.com/tandem-epp/tandem/internal/demo/workload"
)

// Options configure Run.
type Options struct {
	// Requests is the workload, already loaded (cmd/demo checks it before building anything);
	// when nil, Run loads Mix from Traces.
	Requests  []workload.Request
	Traces    fs.FS // traces.Open: the embedded traces or a --data directory
	Mix       workload.Mix
	TimeScale float64
	Listen    string
	// BrokenDecode names the decode pod whose KV connector breaks during the replay (the
	// simulator's recompute_kv fault), for the report to show Tandem's transfer proof catching
	// it; "" keeps every pod healthy. BreakAt is when, as a fraction of Mix.Window (0: from
	// the start).
	BrokenDecode string
	BreakAt      float64
	// Stay keeps the stack up after the summary until ctx ends (for curl by hand).
	Stay   bool
	RunEPP EPPRunner
	// EngineCheckEPP, when set, starts the Tandems of the engine check that follows the
	// replay: one vLLM, one SGLang and one TensorRT-LLM prefill/decode pair with the "epp"
	// hand-off (see CheckEngines). Nil skips it.
	EngineCheckEPP EPPRunner
	Out            io.Writer // summary
	Progress       io.Writer // live progress line
	// ProgressTTY redraws the progress line in place (\r) four times a second; otherwise a
	// line is printed every five seconds.
	ProgressTTY bool
	Logger      logr.Logger
}

// Run starts the stack, replays the workload with a live progress line, prints the summary
// and stops everything (at the end, or when ctx ends).
func Run(ctx context.Context, o Options) error {
	reqs := o.Requests
	if reqs == nil {
		var err error
		if reqs, err = workload.Load(o.Traces, o.Mix); err != nil {
			return err
		}
	}
	if len(reqs) == 0 {
		return errors.New("demo: the workload is empty: set --conv, --code or --mooncake above 0")
	}
	fmt.Fprintf(o.Progress, "Starting 5 simulated pods, Tandem and the gateway on 127.0.0.1 …\n")
	st, err := StartStack(ctx, StackOptions{RunEPP: o.RunEPP, TimeScale: o.TimeScale, Listen: o.Listen, Logger: o.Logger})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer st.Stop()
	fmt.Fprintf(o.Progress, "Gateway %s → Tandem (ext_proc, pool from %s) → pods. Replaying %d requests over %s (time scale %g).\n",
		st.GatewayURL, filepath.Join(st.Dir, "endpoints.yaml"), len(reqs), o.Mix.Window, o.TimeScale)
	fmt.Fprintf(o.Progress, "Tandem's metrics: %s\n", st.MetricsURL)

	podRole := map[string]string{}
	for _, p := range st.Pods {
		podRole[p.Name] = p.Role
	}
	prog := &Progress{Total: len(reqs)}
	brk := Break{Pod: o.BrokenDecode}
	var brokeAt chan time.Time // the break's time, once it happened
	stopBreak := make(chan struct{})
	if brk.Pod != "" {
		after := time.Duration(o.BreakAt * float64(o.Mix.Window))
		brokeAt = make(chan time.Time, 1)
		breakNow := func() error {
			if err := breakPod(st, brk.Pod); err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			brokeAt <- time.Now()
			fmt.Fprintf(o.Progress, "%s's KV connector is broken now: it recomputes every prompt and still answers 200.\n", brk.Pod)
			return nil
		}
		if after <= 0 {
			if err := breakNow(); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(o.Progress, "%s's KV connector breaks %s into the replay.\n", brk.Pod, after.Round(100*time.Millisecond))
			if _, err := findDecode(st, brk.Pod); err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			go func() {
				t := time.NewTimer(after)
				defer t.Stop()
				select {
				case <-t.C:
					if err := breakNow(); err != nil {
						o.Logger.Error(err, "breaking the decode pod")
					}
				case <-stopBreak:
				}
			}()
		}
	}
	start := time.Now()
	brk.Start = start
	stopTicker := make(chan struct{})
	tickerDone := make(chan struct{})
	go func() {
		defer close(tickerDone)
		every, format, final := 5*time.Second, "%s\n", "%s\n"
		if o.ProgressTTY {
			every, format, final = 250*time.Millisecond, "\r%s\033[K", "\r%s\033[K\n"
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stopTicker:
				fmt.Fprintf(o.Progress, final, prog.Line(time.Since(start)))
				return
			case <-t.C:
				fmt.Fprintf(o.Progress, format, prog.Line(time.Since(start)))
			}
		}
	}()
	results := Drive(ctx, st.GatewayURL, reqs, podRole, prog)
	close(stopBreak)
	select {
	case brk.At = <-brokeAt: // nil channel (no broken pod): not ready
	default:
	}
	markRecomputed(results, brk)
	close(stopTicker)
	<-tickerDone
	elapsed := time.Since(start)
	if ctx.Err() != nil {
		fmt.Fprintln(o.Progress, "Interrupted: stopping everything.")
		return nil
	}
	decisions, derr := ScrapeDecisions(st.MetricsURL)
	Report(o.Out, st, results, elapsed, decisions, derr)
	transfers, terr := scrapeTransfersSettled(st.MetricsURL, pdRequests(results, podRole))
	ReportProof(o.Out, st, results, brk, transfers, terr)
	var engineErr error
	if o.EngineCheckEPP != nil {
		fmt.Fprintf(o.Progress, "Checking the epp hand-off on a vLLM, an SGLang and a TensorRT-LLM pair …\n")
		engineErr = ReportEngines(o.Out, CheckEngines(ctx, o.EngineCheckEPP, o.TimeScale, o.Logger))
		if ctx.Err() != nil {
			return nil
		}
	}
	CurlHint(o.Out, st.GatewayURL)
	if o.Stay {
		fmt.Fprintf(o.Out, "The stack stays up until Ctrl-C: gateway %s, Tandem's metrics %s.\n", st.GatewayURL, st.MetricsURL)
		<-ctx.Done()
	} else {
		fmt.Fprintln(o.Out, "(Run with --stay to keep the stack up for that; everything is stopped now.)")
	}
	if engineErr != nil {
		return fmt.Errorf("demo: engine check: %w", engineErr)
	}
	return nil
}

// FindRepoRoot walks up from the working directory to Tandem's go.mod.
func FindRepoRoot() (string, error) { return launch.FindRepoRoot() }
