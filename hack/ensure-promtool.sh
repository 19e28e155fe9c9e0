#!/usr/bin/env bash
# Prints the path of promtool (the Prometheus rules checker and rule unit-test runner), which
# manifests/monitoring_test.go runs on the alert rules. A promtool on PATH is used as is;
# otherwise Debian's prometheus package is downloaded (not installed: no service, no root needed
# once the package lists are there) and only its promtool is unpacked into a cache outside the clone.
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then
  command -v promtool
  exit 0
fi
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/tools/promtool"
if [[ ! -x "$dir/promtool" ]]; then
  echo "fetching promtool from Debian's prometheus package (first run only)" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if ! (cd "$tmp" && apt-get download prometheus >&2); then
    if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -qq >&2
    (cd "$tmp" && apt-get download prometheus >&2)
  fi
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  mkdir -p "$dir"
  install -m 0755 "$tmp/x/usr/bin/promtool" "$dir/promtool"
fi
echo "$dir/promtool"
