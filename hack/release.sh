#!/usr/bin/env bash
# Builds a release's artifacts into DIST (default dist/VERSION), from this checkout:
#   epp, gateway and sim for each of PLATFORMS (default linux/amd64 linux/arm64), as tar.gz;
#   the EPP image as an OCI tarball per platform (make image's builder, hack/image);
#   the Helm chart package (Helm built by hack/ensure-helm.sh), versioned VERSION without its v;
#   the chart rendered with the release's image (tandem-VERSION.yaml, provider none);
#   SHA256SUMS over all of them.
# VERSION defaults to what hack/ldflags.sh stamps (git describe); IMAGE_REPO to
# ghcr.io/tandem-epp/tandem-epp. Nothing is pushed: see the README for pushing the image.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${VERSION:-$(hack/ldflags.sh | sed -n 's/.*version=\([^ ]*\).*/\1/p')}
[[ $VERSION == v* ]] || { echo "release: VERSION=$VERSION must start with v (v0.1.0)" >&2; exit 2; }
IMAGE_REPO=${IMAGE_REPO:-ghcr.io/tandem-epp/tandem-epp}
PLATFORMS=${PLATFORMS:-linux/amd64 linux/arm64}
DIST=${DIST:-dist/$VERSION}
GO=${GO:-go}
ldflags="-s -w $(VERSION=$VERSION hack/ldflags.sh)"

rm -rf "$DIST"
mkdir -p "$DIST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for p in $PLATFORMS; do
  os=${p%/*} arch=${p#*/}
  name="tandem_${VERSION}_${os}_${arch}"
  echo "release: binaries for $p" >&2
  mkdir -p "$work/$name"
  GOOS=$os GOARCH=$arch CGO_ENABLED=0 $GO build -trimpath -ldflags "$ldflags" -o "$work/$name/" ./cmd/epp ./cmd/gateway ./cmd/sim
  cp LICENSE "$work/$name/"
  tar -C "$work" -czf "$DIST/$name.tar.gz" "$name"
  echo "release: image for $p" >&2
  $GO run ./hack/image -ldflags "$ldflags" -image "$IMAGE_REPO:$VERSION" -arch "$arch" -out "$DIST/tandem-epp-image_${VERSION}_${arch}.tar"
done

echo "release: chart" >&2
helm=${TANDEM_HELM:-$(hack/ensure-helm.sh)}
cp -r charts/tandem "$work/chart"
sed -i "s|^  repository: .*|  repository: $IMAGE_REPO|; s|^  tag: .*|  tag: \"$VERSION\"|" "$work/chart/values.yaml"
"$helm" package "$work/chart" --version "${VERSION#v}" --app-version "$VERSION" -d "$DIST" >&2
"$helm" template tandem "$DIST/tandem-${VERSION#v}.tgz" > "$DIST/tandem-$VERSION.yaml"

(cd "$DIST" && sha256sum -- * > SHA256SUMS)
echo "release: $DIST" >&2
ls -l "$DIST" >&2
