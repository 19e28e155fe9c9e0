#!/usr/bin/env bash
# Builds Helm (pinned) from the Go module proxy into a cache outside the clone, once, and prints
# the path of the binary. The chart tests (manifests/chart_test.go) and `make release` run it;
# hack/test.sh exports it as TANDEM_HELM. A cold build takes a few minutes. Safe to run
# concurrently (hack/lib/cache.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/cache.sh"
ver=v3.22.0
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/tools/helm-$ver"
build_helm() {
  echo "building helm $ver into $dir (first run only, a few minutes)" >&2
  # The module's own go.mod and go.sum pin Helm's dependencies; -X sets what `helm version` prints.
  GOFLAGS=-mod=mod GOBIN="$1" CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$ver" "helm.sh/helm/v3/cmd/helm@$ver" >&2
}
cache_build "$dir" build_helm helm
echo "$dir/helm"
