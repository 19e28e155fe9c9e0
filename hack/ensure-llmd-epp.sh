#!/usr/bin/env bash
# Builds llm-d's endpoint picker and routing sidecar (llm-d-inference-scheduler, pinned: its
# cmd/epp and cmd/pd-sidecar) from the Go module proxy into a cache outside the clone, once,
# with CGO_ENABLED=0, and prints the directory holding `epp` and `pd-sidecar`. `make bench-live`
# runs them beside Tandem. The module is built from a copy of its own module directory, so its
# own go.mod and go.sum pin its dependencies. A cold build takes several minutes.
#
# One dependency, github.com/llm-d/llm-d-kv-cache, may be refused by the module proxy
# (proxy.golang.org answers 403 "not available" for it). The same repository's tag is served under
# its former module path, github.com/llm-d/llm-d-kv-cache-manager; that copy is used in its place
# only when its files hash (Go's h1: module hash, computed as the go command does) to the sum the
# scheduler's own go.sum pins, so the build uses exactly the code llm-d released.
# TANDEM_LLMD_KVCACHE_SRC: a directory holding that module (a `git archive` of its tag), used
# instead of both; it is held to the same hash.
# Safe to run concurrently (hack/lib/cache.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/cache.sh"
mod=github.com/llm-d/llm-d-inference-scheduler
ver=v0.7.1
kvcache=github.com/llm-d/llm-d-kv-cache
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/tools/llm-d-inference-scheduler-$ver"

# module_dir MODULE@VERSION: downloads a module from the proxy and prints its directory.
module_dir() {
  (cd "${TMPDIR:-/tmp}" && GOWORK=off GOFLAGS= go mod download -json "$1" 2>/dev/null) |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

# module_h1 DIR MODULE@VERSION: Go's h1: hash (golang.org/x/mod/sumdb/dirhash Hash1) of a module
# whose files are DIR's: the SHA-256 of the sorted lines "<sha256 of file>  MODULE@VERSION/<path>".
module_h1() {
  local dir=$1 prefix=$2/ hex
  hex=$(cd "$dir" && find . -type f -print | sed 's|^\./||' | LC_ALL=C sort | while IFS= read -r f; do
      printf '%s  %s\n' "$(sha256sum <"$f" | cut -d' ' -f1)" "$prefix$f"
    done | sha256sum | cut -d' ' -f1)
  printf 'h1:%s\n' "$(printf "$(sed 's/../\\x&/g' <<<"$hex")" | base64)"
}

# kvcache_replacement WORK: when the proxy refuses the kv-cache module the scheduler at WORK
# requires, points WORK's go.mod at a copy whose hash matches WORK's go.sum.
kvcache_replacement() {
  local work=$1 kver want src got
  kver=$(awk -v m="$kvcache" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$work/go.mod")
  [[ -n "$kver" ]] || return 0 # this scheduler does not use it
  [[ -n "$(module_dir "$kvcache@$kver")" && -z "${TANDEM_LLMD_KVCACHE_SRC:-}" ]] && return 0
  want=$(awk -v m="$kvcache" -v v="$kver" '$1 == m && $2 == v { print $3 }' "$work/go.sum")
  [[ -n "$want" ]] || { echo "$work/go.sum pins no hash for $kvcache $kver" >&2; return 1; }
  if [[ -n "${TANDEM_LLMD_KVCACHE_SRC:-}" ]]; then
    src=$(cd "$TANDEM_LLMD_KVCACHE_SRC" && pwd) || return 1
  else
    echo "the module proxy refuses $kvcache@$kver; trying its former path $kvcache-manager@$kver" >&2
    src=$(module_dir "$kvcache-manager@$kver")
    [[ -n "$src" ]] || { echo "the module proxy serves neither $kvcache@$kver nor $kvcache-manager@$kver; set TANDEM_LLMD_KVCACHE_SRC (see this script's header)" >&2; return 1; }
  fi
  grep -q "^module $kvcache\$" "$src/go.mod" || { echo "$src holds no $kvcache module (its go.mod)" >&2; return 1; }
  got=$(module_h1 "$src" "$kvcache@$kver")
  [[ "$got" == "$want" ]] || { echo "$src hashes to $got, but llm-d's go.sum pins $kvcache $kver to $want: not used" >&2; return 1; }
  echo "using $src for $kvcache@$kver (hash $got, as llm-d's go.sum pins)" >&2
  (cd "$work" && go mod edit -replace "$kvcache=$src")
}

build_llmd_epp() {
  local out=$1 src work
  echo "building $mod@$ver (cmd/epp, cmd/pd-sidecar) into $dir (first run only, several minutes)" >&2
  src=$(module_dir "$mod@$ver")
  [[ -n "$src" && -f "$src/go.mod" ]] || { echo "go mod download $mod@$ver gave no module directory" >&2; return 1; }
  work="$out/src"
  cp -r "$src" "$work" && chmod -R u+w "$work"
  kvcache_replacement "$work" || return 1
  (cd "$work" && GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$out/" ./cmd/epp ./cmd/pd-sidecar) >&2 || {
    echo "building $mod@$ver failed (above)" >&2
    return 1
  }
  rm -rf "$work"
}
cache_build "$dir" build_llmd_epp epp pd-sidecar
echo "$dir"
