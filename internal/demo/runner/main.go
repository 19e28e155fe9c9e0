// Command runner is the demo proper, built and started by cmd/demo (internal/demo/launch) once
// the inputs are checked: it takes the same flags, starts the simulated pods, Tandem
// (--epp-binary, else it builds ./cmd/epp) and the local gateway, replays the traces and prints
// the summary. Ctrl-C stops everything. It only parses flags and runs internal/demo; it must not
// hold demo logic of its own.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/demo/launch"
	"github.com/tandem-epp/tandem/internal/version"
)

func main() {
	err := run(os.Args[1:])
	switch {
	case errors.Is(err, launch.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	f, err := launch.Parse(args, os.Stderr)
	if err != nil {
		return err
	}
	if f.Version {
		fmt.Println(version.Line("demo-runner"))
		return nil
	}
	reqs, err := f.Workload()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	bin := f.EPPBinary
	if bin == "" {
		root, err := demo.FindRepoRoot()
		if err != nil {
			return fmt.Errorf("%w; or pass --epp-binary", err)
		}
		tmp, err := os.MkdirTemp("", "tandem-demo-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		fmt.Fprintln(os.Stderr, "Building Tandem (./cmd/epp) …")
		if bin, err = demo.BuildEPP(ctx, root, tmp); err != nil {
			return err
		}
	}
	// A directory of its own per run (kept: the logs are for reading afterwards), so two demos
	// never write one file and nothing else's file or link is written through.
	logDir, err := os.MkdirTemp("", "tandem-demo-logs-")
	if err != nil {
		return err
	}
	logPath := filepath.Join(logDir, "epp.log")
	fmt.Fprintf(os.Stderr, "Tandem's log: %s\n", logPath)
	env := f.EPPEnv()
	var engineCheck demo.EPPRunner
	if f.EngineCheck {
		engineCheck = demo.ProcessEPP(bin, filepath.Join(logDir, "engines-epp.log"), env)
	}
	return demo.Run(ctx, demo.Options{
		Requests: reqs, Mix: f.Mix, TimeScale: f.TimeScale, Listen: f.Listen, Stay: f.Stay,
		BrokenDecode: f.BrokenDecode, BreakAt: f.BreakAt,
		RunEPP: demo.ProcessEPP(bin, logPath, env), EngineCheckEPP: engineCheck,
		Out: os.Stdout, Progress: os.Stderr, ProgressTTY: launch.IsTerminal(os.Stderr),
	})
}
