# Tandem — the two commands a new user needs are `make demo` and `make test`.
SHELL := /usr/bin/env bash
GO ?= go

# Version and commit stamped into every binary (`epp --version`), from git unless given:
# `make build VERSION=v0.2.0 COMMIT=…`. hack/ldflags.sh is shared with the Dockerfile.
LDFLAGS := $(shell VERSION='$(VERSION)' COMMIT='$(COMMIT)' hack/ldflags.sh)

# make demo ARGS='--handoff epp --stay' passes flags to the demo (go run ./cmd/demo --help lists them).
ARGS ?=
# make image: an OCI image of the static cmd/epp binary, as a tarball for docker/podman load,
# kind load image-archive or crane push. IMAGE names it; GOARCH picks the platform.
IMAGE ?= ghcr.io/tandem-epp/tandem-epp:$(shell hack/ldflags.sh | sed -n 's/.*version=\([^ ]*\).*/\1/p')
IMAGE_TAR ?= bin/tandem-epp-image.tar

.PHONY: demo test build image release lint helm-lint bench-extproc bench-picker bench-metrics bench-handoff bench-quality bench-quality-full bench-live bench-advisor bench-topology

## demo: simulated prefill/decode/standard pods, Tandem and a local gateway on loopback, a real trace replayed.
demo:
	@echo "make demo: compiling the launcher (cmd/demo); it checks the inputs, then builds Tandem with a progress line." >&2
	$(GO) run -ldflags "$(LDFLAGS)" ./cmd/demo $(ARGS)

## test: gofmt, vet, staticcheck and every test (-race) against a real kube-apiserver + etcd, Redis and llm-d's simulator.
test:
	hack/test.sh

BIN_DIR ?= bin

## build: static binaries of cmd/... into bin/ (BIN_DIR), stamped with the version.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(BIN_DIR)/ ./cmd/...

## image: the EPP image as an OCI tarball, built without a container engine (cmd/epp on an empty base).
image:
	$(GO) run ./hack/image -ldflags "-s -w $(LDFLAGS)" -image "$(IMAGE)" -out "$(IMAGE_TAR)" $(if $(GOARCH),-arch $(GOARCH))

## release: a version's artifacts in dist/VERSION (hack/release.sh): epp, gateway and sim per platform,
## the image tarball per platform, the chart package with the release's image, the chart rendered, SHA256SUMS.
## make release VERSION=v0.1.0 [IMAGE_REPO=<registry>/tandem-epp] [PLATFORMS='linux/amd64'].
release:
	VERSION='$(VERSION)' IMAGE_REPO='$(IMAGE_REPO)' PLATFORMS='$(PLATFORMS)' hack/release.sh

lint:
	gofmt -l $$(git ls-files '*.go') | (! grep .)
	$(GO) vet ./...
	$$(hack/ensure-staticcheck.sh) ./...

## helm-lint: helm lint of charts/tandem (Helm is built once from the Go module proxy).
helm-lint:
	$$(hack/ensure-helm.sh) lint --strict charts/tandem --set image.tag=lint

## bench-extproc: whole ext_proc round trip, Tandem vs upstream lwepp in the same run.
bench-extproc:
	$(GO) run ./bench/extproc

## bench-picker: the full PD pick on pools of 16, 128 and 1024 endpoints.
bench-picker:
	$(GO) run ./bench/picker

## bench-metrics: scrape-and-parse cost and the cores needed to keep 1024 endpoints fresh.
bench-metrics:
	$(GO) run ./bench/metrics

## bench-handoff: time Tandem adds to TTFT when it runs the prefill leg itself.
bench-handoff:
	$(GO) run ./bench/handoff

## bench-quality: replay real traces through the real picker in virtual time.
bench-quality:
	$(GO) run ./bench/quality

## bench-advisor: the P:D ratio advisor against every split of the default shape's 10 pods, measured (about 20 minutes on 2 cores).
bench-advisor:
	$(GO) run ./bench/quality -check advisor -workloads conv,code,mix,mooncake -clusters 4x1p1d+2s -seeds 1 -validate=false $(ARGS)

## bench-topology: topology-aware against topology-blind pd-predictive on pods in two zones whose cross-zone KV transfer is 10x slower (about a minute).
bench-topology:
	$(GO) run ./bench/quality -check topology -workloads mix -clusters 1x4p4d@2z,2x2p2d@2z -loads 0.8,1.0 -seeds 3 -validate=false -capacity=false $(ARGS)

## bench-quality-full: every shape, load, engine scenario and workload (about three times the default's time).
bench-quality-full:
	$(GO) run ./bench/quality -full

## bench-live: one trace replayed in real time through every router to real llm-d simulators (llm-d-inference-sim,
## built once from the Go module proxy) behind cmd/epp and cmd/gateway, and through llm-d's own EPP and pd-sidecar
## when they build (hack/ensure-llmd-epp.sh) and the bench may make network namespaces (root with CAP_NET_ADMIN:
## hack/can-netns.sh; a namespace per pod); ~10 min
## on 2 cores, ~21 with ARGS=-capacity (the SLO-goodput capacity search).
## make bench-live ARGS='-requests 100 -loads 0.8' passes flags (go run ./bench/live -h lists them).
bench-live:
	@sim=$$(hack/ensure-llmd-sim.sh) || exit 1; llmd=; \
	if ! hack/can-netns.sh; then echo "bench-live: llm-d's EPP is left out (its pods need network namespaces)" >&2; \
	elif ! llmd=$$(hack/ensure-llmd-epp.sh); then echo "bench-live: llm-d's EPP did not build (above): it is left out" >&2; llmd=; fi; \
	set -x; $(GO) run ./bench/live -sim "$$sim" $${llmd:+-llmd-epp "$$llmd/epp" -llmd-sidecar "$$llmd/pd-sidecar"} $(ARGS)
