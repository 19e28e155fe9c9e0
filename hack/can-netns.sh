#!/usr/bin/env bash
# Exits 0 when this process may make network namespaces (root, ip(8) — installed if missing —
# and CAP_NET_ADMIN), as bench/live needs to run llm-d's EPP beside Tandem; otherwise says why
# on stderr and exits 1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ $(id -u) -ne 0 ]]; then echo "not root, so no network namespaces" >&2; exit 1; fi
"$here/ensure-ip.sh" >/dev/null || { echo "no ip(8) (iproute2), so no network namespaces" >&2; exit 1; }
probe="tandem-probe-$$"
if ! ip netns add "$probe" 2>/dev/null; then echo "ip netns add refused (no CAP_NET_ADMIN?), so no network namespaces" >&2; exit 1; fi
ip netns del "$probe"
