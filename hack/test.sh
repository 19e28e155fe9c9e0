#!/usr/bin/env bash
# The whole test suite: formatting, vet, staticcheck, and every Go test with the race detector,
# against a real kube-apiserver + etcd, real Redis, Helm, promtool and a real nginx. `make test` and .ci/run call this.
set -euo pipefail
cd "$(dirname "$0")/.."
export KUBEBUILDER_ASSETS="$(hack/ensure-k8s-bins.sh)"
export TANDEM_REDIS_SERVER="$(hack/ensure-redis.sh)"
# The chart tests run Helm (built once from the Go module proxy) and the rules tests promtool.
export TANDEM_HELM="$(hack/ensure-helm.sh)"
export TANDEM_PROMTOOL="$(hack/ensure-promtool.sh)"
hack/ensure-nginx.sh >/dev/null # e2e/nginx_real_test.go runs Debian's nginx with its njs module
staticcheck="$(hack/ensure-staticcheck.sh)"

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './hack/k8s-tools/*'))
if [[ -n "$unformatted" ]]; then echo "gofmt would change:"; echo "$unformatted"; exit 1; fi
echo "== go vet"
go vet ./...
echo "== staticcheck"
"$staticcheck" ./...
echo "== go test -race"
go test -race -count=1 -timeout 25m ./... "$@"
