#!/usr/bin/env bash
# The whole test suite: formatting, vet, staticcheck, and every Go test with the race detector,
# against a real kube-apiserver + etcd, real Redis, Helm, promtool, a real nginx, llm-d's simulator
# and, where network namespaces can be made, llm-d's EPP. `make test` and .ci/run call this.
set -euo pipefail
cd "$(dirname "$0")/.."
export KUBEBUILDER_ASSETS="$(hack/ensure-k8s-bins.sh)"
export TANDEM_REDIS_SERVER="$(hack/ensure-redis.sh)"
# The chart tests run Helm (built once from the Go module proxy) and the rules tests promtool.
export TANDEM_HELM="$(hack/ensure-helm.sh)"
export TANDEM_PROMTOOL="$(hack/ensure-promtool.sh)"
# bench/live's test runs llm-d's vLLM simulator (built once from the Go module proxy).
export TANDEM_LLMD_SIM="$(hack/ensure-llmd-sim.sh)"
# llm-d's EPP and routing sidecar, built once from the Go module proxy. bench/live's transfer-proof
# test runs the sidecar in front of llm-d's simulator on loopback; its llm-d test runs llm-d's EPP
# too, each simulated pod in a network namespace of its own: only where this process may make
# namespaces (root with CAP_NET_ADMIN). Anything short of that leaves those tests skipped, and says so.
if llmd="$(hack/ensure-llmd-epp.sh)"; then
  export TANDEM_LLMD_SIDECAR="$llmd/pd-sidecar"
  if hack/can-netns.sh; then
    export TANDEM_LLMD_EPP="$llmd/epp"
  else
    echo "NOTE: bench/live's TestLLMDEPPOnRealSimulators will be skipped (llm-d's pods need network namespaces)" >&2
  fi
else
  echo "NOTE: llm-d's EPP and sidecar did not build (above): bench/live's TestLLMDEPPOnRealSimulators and the pd-sidecar case of TestRecomputeDetectedOnLLMDSimulator will be skipped" >&2
fi
hack/ensure-nginx.sh >/dev/null # e2e/nginx_real_test.go runs Debian's nginx with its njs module
staticcheck="$(hack/ensure-staticcheck.sh)"

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './hack/k8s-tools/*'))
if [[ -n "$unformatted" ]]; then echo "gofmt would change:"; echo "$unformatted"; exit 1; fi
echo "== go vet"
go vet ./...
echo "== go build -tags nokube (the demo's Tandem: no Kubernetes client)"
go build -tags nokube ./...
echo "== staticcheck"
"$staticcheck" ./...
echo "== go test -race"
# The whole output is kept, and on a failure the failing tests are repeated at the end, where
# a log's tail (CI shows its last lines) still names them.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if go test -race -count=1 -timeout 25m ./... "$@" 2>&1 | tee "$log"; [[ ${PIPESTATUS[0]} -ne 0 ]]; then
  echo "== failed:"
  grep -E -A12 '^(--- FAIL|FAIL|panic:)' "$log" | head -150
  exit 1
fi
