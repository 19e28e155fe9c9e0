#!/usr/bin/env bash
# Builds llm-d's endpoint picker and routing sidecar (llm-d-inference-scheduler, pinned: its
# cmd/epp and cmd/pd-sidecar) from the Go module proxy into a cache outside the clone, once,
# with CGO_ENABLED=0, and prints the directory holding `epp` and `pd-sidecar`. `make bench-live`
# runs them beside Tandem. The module is built from a copy of its own module directory, so its
# own go.mod and go.sum pin its dependencies. A cold build takes several minutes.
#
# TANDEM_LLMD_KVCACHE_SRC: a directory holding github.com/llm-d/llm-d-kv-cache at the version
# the scheduler's go.mod requires (a `git archive` of its tag), used instead of the module
# proxy, which may refuse that module (proxy.golang.org answers 403 "not available" for it).
# Safe to run concurrently (hack/lib/cache.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/cache.sh"
mod=github.com/llm-d/llm-d-inference-scheduler
ver=v0.7.1
kvcache=github.com/llm-d/llm-d-kv-cache
suffix=
[[ -n "${TANDEM_LLMD_KVCACHE_SRC:-}" ]] && suffix=-kvcache-src
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/tools/llm-d-inference-scheduler-$ver$suffix"
build_llmd_epp() {
  local out=$1 src work
  echo "building $mod@$ver (cmd/epp, cmd/pd-sidecar) into $dir (first run only, several minutes)" >&2
  src=$(cd "$out" && GOWORK=off GOFLAGS= go mod download -json "$mod@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -n "$src" && -f "$src/go.mod" ]] || { echo "go mod download $mod@$ver gave no module directory" >&2; return 1; }
  work="$out/src"
  cp -r "$src" "$work" && chmod -R u+w "$work"
  if [[ -n "${TANDEM_LLMD_KVCACHE_SRC:-}" ]]; then
    local kv
    kv=$(cd "$TANDEM_LLMD_KVCACHE_SRC" && pwd)
    grep -q "^module $kvcache\$" "$kv/go.mod" || { echo "TANDEM_LLMD_KVCACHE_SRC=$kv holds no $kvcache module" >&2; return 1; }
    (cd "$work" && go mod edit -replace "$kvcache=$kv")
  fi
  (cd "$work" && GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$out/" ./cmd/epp ./cmd/pd-sidecar) >&2 || {
    echo "building $mod@$ver failed; if $kvcache could not be downloaded, set TANDEM_LLMD_KVCACHE_SRC (see this script's header)" >&2
    return 1
  }
  rm -rf "$work"
}
cache_build "$dir" build_llmd_epp epp pd-sidecar
echo "$dir"
