#!/usr/bin/env bash
# Prints the path of promtool (the Prometheus rules checker and rule unit-test runner), which
# manifests/monitoring_test.go runs on the alert rules. A promtool on PATH is used as is;
# otherwise Debian's prometheus package is downloaded (not installed: no service, no root needed
# once the package lists are there) and only its promtool is unpacked into a cache outside the clone
# (safe to run concurrently: hack/lib/cache.sh).
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then
  command -v promtool
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/cache.sh"
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/tools/promtool"
fetch_promtool() {
  local out=$1 deb
  echo "fetching promtool from Debian's prometheus package (first run only)" >&2
  deb=$(mktemp -d)
  if ! (cd "$deb" && apt-get download prometheus >&2); then
    if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -qq >&2
    (cd "$deb" && apt-get download prometheus >&2)
  fi
  dpkg-deb -x "$deb"/prometheus_*.deb "$deb/x"
  install -m 0755 "$deb/x/usr/bin/promtool" "$out/promtool"
  rm -rf "$deb"
}
cache_build "$dir" fetch_promtool promtool
echo "$dir/promtool"
