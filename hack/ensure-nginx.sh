#!/usr/bin/env bash
# Makes sure Debian's nginx and its njs module are installed (e2e/nginx_real_test.go runs a real
# nginx, in the way NGINX Gateway Fabric configures it, in front of Tandem). Prints the path of
# the nginx binary; the njs module is at /usr/lib/nginx/modules/ngx_http_js_module.so.
set -euo pipefail
if ! command -v nginx >/dev/null 2>&1 || [[ ! -f /usr/lib/nginx/modules/ngx_http_js_module.so ]]; then
  echo "installing nginx and libnginx-mod-http-js from Debian (first run only)" >&2
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nginx-light libnginx-mod-http-js >&2
  # The package may start a system service; the tests run their own nginx.
  (command -v systemctl >/dev/null && $SUDO systemctl stop nginx 2>/dev/null) || true
  (command -v service >/dev/null && $SUDO service nginx stop >/dev/null 2>&1) || true
fi
command -v nginx
