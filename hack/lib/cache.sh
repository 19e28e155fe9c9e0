# shellcheck shell=bash
# Shared by the hack/ensure-*.sh scripts that cache tools outside the clone, where several runs
# (two `make test` at once, or several clones) may look for the same tool at the same moment.
#
# cache_build DIR BUILD FILE...
#   Makes sure DIR holds the executables FILE...; if it does not, runs `BUILD TMP` to build them
#   into a fresh temporary directory next to DIR, checks they are all there, and only then moves
#   the directory into place with one rename. The build is serialised by an flock on DIR.lock, so
#   a second run waits for the first and then finds DIR complete. A complete DIR is never touched;
#   an incomplete one (a build killed by an older version of these scripts) is renamed aside first.
#   BUILD runs in a condition, where `set -e` does not stop it: the check that every FILE was
#   produced is what catches a failed step.

cache_ready() {
  local dir=$1 f
  shift
  for f in "$@"; do
    [[ -x "$dir/$f" ]] || return 1
  done
}

cache_build() {
  local dir=$1 build=$2
  shift 2
  cache_ready "$dir" "$@" && return 0
  mkdir -p "$(dirname "$dir")"
  local lock
  exec {lock}>"$dir.lock"
  if ! flock -n "$lock"; then
    echo "waiting for another run that is building $dir" >&2
    flock "$lock"
  fi
  if cache_ready "$dir" "$@"; then
    exec {lock}>&-
    return 0
  fi
  local tmp
  tmp=$(mktemp -d "$dir.tmp.XXXXXX")
  if ! "$build" "$tmp"; then
    rm -rf "$tmp"
    exec {lock}>&-
    echo "building $dir failed" >&2
    return 1
  fi
  if ! cache_ready "$tmp" "$@"; then
    rm -rf "$tmp"
    exec {lock}>&-
    echo "building $dir did not produce: $*" >&2
    return 1
  fi
  if [[ -e "$dir" ]]; then
    local stale
    stale=$(mktemp -d "$dir.stale.XXXXXX")
    mv -T "$dir" "$stale/old"
    rm -rf "$stale"
  fi
  mv -T "$tmp" "$dir"
  exec {lock}>&-
}
