// Package outliere2e holds the end-to-end tests of fault tolerance (issue 12): simulated vLLM
// pods run as real processes (cmd/sim, built once per run) that the tests SIGKILL, restart,
// hang or make fail; Tandem runs in-process (internal/app) on a file or Kubernetes pool that is
// never updated; the local gateway (internal/gateway) proxies a steady load to them, all on
// 127.0.0.1. Each test measures failed requests and recovery times, prints them as RESULT
// lines, and checks that every tracker and token-load ledger charge is released at the end.
// It has tests only; it must not be imported.
package outliere2e
