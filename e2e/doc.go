// Package e2e holds Tandem's end-to-end tests: real HTTP clients talk to the local gateway
// (internal/gateway), which asks Tandem (internal/app in-process, or the built cmd/epp binary)
// over a real ext_proc gRPC stream and proxies to simulated model servers (internal/sim), all
// on 127.0.0.1; the pool comes from an endpoints file or from a real kube-apiserver
// (internal/testenv). The package has tests only; it must not be imported, and it must not
// replace a real component with a mock where the real one runs here.
package e2e
