// Command demo is the one-command demo (`make demo`): simulated prefill, decode and standard
// pods, Tandem with a file-sourced pool and the local gateway, all on 127.0.0.1, a slice of
// real traces replayed through them, then a summary. It checks its flags and traces first, then
// builds Tandem and the demo runner with a progress line and runs the runner; Ctrl-C stops
// everything. It only calls internal/demo/launch; it must not hold demo logic of its own, and
// it must stay light (no gRPC, no Kubernetes) so that it compiles in seconds.
package main

import (
	"os"

	"github.com/tandem-epp/tandem/internal/demo/launch"
)

func main() {
	os.Exit(launch.Main(os.Args[1:], os.Stdout, os.Stderr))
}
