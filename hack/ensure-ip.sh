#!/usr/bin/env bash
# Makes sure ip(8) (Debian's iproute2) is installed: bench-live gives each simulated pod a
# network namespace of its own when llm-d's EPP runs beside Tandem. Prints the path of ip.
set -euo pipefail
if ! command -v ip >/dev/null 2>&1; then
  echo "installing iproute2 from Debian (first run only)" >&2
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends iproute2 >&2
fi
command -v ip
