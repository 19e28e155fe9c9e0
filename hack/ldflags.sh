#!/usr/bin/env bash
# Prints the -ldflags -X arguments that stamp a build's version and commit (what every binary's
# --version shows). VERSION and COMMIT from the environment win (the Dockerfile's build args,
# `make VERSION=…`); otherwise they come from git: the nearest v* tag (`git describe`, e.g.
# v0.1.0 or v0.1.0-3-gabc1234-dirty) and the commit, "-dirty" when the tree has changes. Outside
# a git checkout the version is v0.1.0-dev and the commit is left for the binary to report as unknown.
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=github.com/tandem-epp/tandem/internal/version
version=${VERSION:-}
commit=${COMMIT:-}
if git rev-parse --git-dir >/dev/null 2>&1; then
  [[ -n $version ]] || version=$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || true)
  if [[ -z $commit ]]; then
    commit=$(git rev-parse HEAD)
    git diff --quiet HEAD -- 2>/dev/null || commit+=-dirty
  fi
fi
[[ -n $version ]] || version=v0.1.0-dev
out="-X $pkg.version=$version"
[[ -z $commit ]] || out+=" -X $pkg.commit=$commit"
echo "$out"
