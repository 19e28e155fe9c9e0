#!/usr/bin/env bash
# Builds (once) the real kube-apiserver and etcd that the Kubernetes tests run against,
# and prints the directory that holds them (use it as KUBEBUILDER_ASSETS).
#
# The binaries are cached outside the clone, keyed by the tools module's go.sum, so a
# fresh clone on the same machine reuses them; a cold build takes about six minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tools="$here/k8s-tools"
key=$(cat "$tools/go.mod" "$tools/go.sum" | sha256sum | cut -c1-12)
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/k8s-bins/v1.36.3-$key"
if [[ -x "$dir/kube-apiserver" && -x "$dir/etcd" ]]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$dir.tmp"
ver=v1.36.3
ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf+=" -X $p.gitVersion=$ver -X $p.gitMajor=1 -X $p.gitMinor=36 -X $p.gitTreeState=clean"
done
(
  cd "$tools"
  echo "building kube-apiserver $ver and etcd into $dir (first run only, ~6 min)" >&2
  go build -trimpath -ldflags "$ldf" -o "$dir.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >&2
  go build -trimpath -ldflags "-s -w" -o "$dir.tmp/etcd" go.etcd.io/etcd/server/v3 >&2
)
rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "$dir"
