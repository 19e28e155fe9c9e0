#!/usr/bin/env bash
# Builds llm-d's vLLM simulator (llm-d-inference-sim, pinned) from the Go module proxy into a
# cache outside the clone, once, and prints the path of the binary. `make bench-live` and its
# test (bench/live) run it; hack/test.sh exports it as TANDEM_LLMD_SIM. The module is built
# inside its own module directory, so its own go.mod and go.sum pin its dependencies, with
# CGO_ENABLED=0 (its dummy tokenizer needs no C library). A cold build takes a few minutes.
# Safe to run concurrently (hack/lib/cache.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/cache.sh"
mod=github.com/llm-d/llm-d-inference-sim
ver=v0.10.2
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/tools/llm-d-inference-sim-$ver"
build_llmd_sim() {
  echo "building $mod@$ver into $dir (first run only, a few minutes)" >&2
  local src
  # -json prints the module's directory in the module cache; outside any module, GOFLAGS empty.
  src=$(cd "$1" && GOWORK=off GOFLAGS= go mod download -json "$mod@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -n "$src" && -f "$src/go.mod" ]] || { echo "go mod download $mod@$ver gave no module directory" >&2; return 1; }
  (cd "$src" && GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$1/llm-d-inference-sim" ./cmd/llm-d-inference-sim) >&2
}
cache_build "$dir" build_llmd_sim llm-d-inference-sim
echo "$dir/llm-d-inference-sim"
