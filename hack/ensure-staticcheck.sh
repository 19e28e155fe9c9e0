#!/usr/bin/env bash
# Builds staticcheck (pinned) from the Go module proxy into a cache outside the clone; prints its path.
set -euo pipefail
ver=v0.8.2
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/tools/staticcheck-$ver"
if [[ ! -x "$dir/staticcheck" ]]; then
  mkdir -p "$dir"
  GOBIN="$dir" go install "honnef.co/go/tools/cmd/staticcheck@$ver" >&2
fi
echo "$dir/staticcheck"
