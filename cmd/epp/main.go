// Command epp is Tandem, the prefill/decode-aware Endpoint Picker: it serves the Endpoint
// Picker Protocol over Envoy ext_proc for one InferencePool (or an endpoints file).
// `epp --help` lists every flag; routing knobs are AIBRIX_* variables (docs/configuration.md).
// It only hands the command line and environment to internal/app; it must not hold wiring or
// routing logic of its own.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tandem-epp/tandem/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := app.Run(ctx, os.Args[1:], os.Stdout)
	switch {
	case errors.Is(err, app.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "epp:", err)
		os.Exit(1)
	}
}
