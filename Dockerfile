# syntax=docker/dockerfile:1
# Tandem's EPP image: a static binary on distroless, running as the nonroot user (65532).
#
#   docker build -t tandem-epp .                          # production (default, last stage)
#   docker build --target conformance -t tandem-epp:conf . # entrypoint adds --conformance
#
# `epp --version` shows the version and commit from git (the build context includes .git), or
# from --build-arg VERSION=v0.2.0 --build-arg COMMIT=<sha> when given: hack/ldflags.sh, as `make build`.
# Without a container engine, `make image` builds an equivalent image tarball (see the README).
#
# The conformance image honours the upstream suite's test-epp-endpoint-selection header and echoes
# x-conformance-test-served-endpoint; never run it in production. conformance/README.md shows how to
# load it under the lwepp tag the upstream manifests use.

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS TARGETARCH VERSION COMMIT
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w $(hack/ldflags.sh)" -o /out/epp ./cmd/epp

FROM gcr.io/distroless/static-debian12:nonroot AS conformance
COPY --from=build /out/epp /epp
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["/epp", "--conformance"]

FROM gcr.io/distroless/static-debian12:nonroot AS epp
COPY --from=build /out/epp /epp
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["/epp"]
