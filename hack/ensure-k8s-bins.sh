#!/usr/bin/env bash
# Builds (once) the real kube-apiserver and etcd that the Kubernetes tests run against,
# and prints the directory that holds them (use it as KUBEBUILDER_ASSETS).
#
# The binaries are cached outside the clone, keyed by the tools module's go.sum, so a
# fresh clone on the same machine reuses them; a cold build takes about six minutes.
# Safe to run concurrently: one run builds, the others wait for it (hack/lib/cache.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/cache.sh"
tools="$here/k8s-tools"
key=$(cat "$tools/go.mod" "$tools/go.sum" | sha256sum | cut -c1-12)
ver=v1.36.3
dir="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/k8s-bins/$ver-$key"
build_k8s_bins() {
  local out=$1 ldf="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $p.gitVersion=$ver -X $p.gitMajor=1 -X $p.gitMinor=36 -X $p.gitTreeState=clean"
  done
  echo "building kube-apiserver $ver and etcd into $dir (first run only, ~6 min)" >&2
  (
    cd "$tools"
    go build -trimpath -ldflags "$ldf" -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >&2
    go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3 >&2
  )
}
cache_build "$dir" build_k8s_bins kube-apiserver etcd
echo "$dir"
