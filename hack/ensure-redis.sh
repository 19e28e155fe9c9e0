#!/usr/bin/env bash
# Makes sure Debian's redis-server is installed (the shared-ledger tests start real Redis
# servers on loopback themselves). Prints the path of the binary.
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1; then
  echo "installing redis-server from Debian (first run only)" >&2
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server >&2
  # The package may start a system service; the tests run their own servers.
  (command -v systemctl >/dev/null && $SUDO systemctl stop redis-server 2>/dev/null) || true
  (command -v service >/dev/null && $SUDO service redis-server stop >/dev/null 2>&1) || true
fi
command -v redis-server
