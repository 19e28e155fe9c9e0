#!/usr/bin/env bash
# Builds staticcheck (pinned) from the Go module proxy into a cache outside the clone; prints its
# path. Safe to run concurrently (hack/lib/cache.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/cache.sh"
ver=v0.8.2
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/tools/staticcheck-$ver"
build_staticcheck() {
  GOBIN="$1" go install "honnef.co/go/tools/cmd/staticcheck@$ver" >&2
}
cache_build "$dir" build_staticcheck staticcheck
echo "$dir/staticcheck"
