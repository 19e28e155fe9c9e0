#!/usr/bin/env bash
# Builds Helm (pinned) from the Go module proxy into a cache outside the clone, once, and prints
# the path of the binary. The chart tests (manifests/chart_test.go) run it; hack/test.sh exports
# it as TANDEM_HELM. A cold build takes a few minutes.
set -euo pipefail
ver=v3.22.0
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/tools/helm-$ver"
if [[ ! -x "$dir/helm" ]]; then
  mkdir -p "$dir.tmp"
  echo "building helm $ver into $dir (first run only, a few minutes)" >&2
  # The module's own go.mod and go.sum pin Helm's dependencies; -X sets what `helm version` prints.
  GOFLAGS=-mod=mod GOBIN="$dir.tmp" CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$ver" "helm.sh/helm/v3/cmd/helm@$ver" >&2
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
fi
echo "$dir/helm"
