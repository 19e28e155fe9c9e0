# Tandem — the two commands a new user needs are `make demo` and `make test`.
SHELL := /usr/bin/env bash
GO ?= go

.PHONY: demo test build lint bench-extproc bench-picker bench-metrics bench-handoff bench-quality

## demo: simulated prefill/decode/standard pods, Tandem and a local gateway on loopback, a real trace replayed.
demo:
	$(GO) run ./cmd/demo

## test: gofmt, vet, staticcheck and every test (-race) against a real kube-apiserver + etcd and Redis.
test:
	hack/test.sh

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/ ./cmd/...

lint:
	gofmt -l $$(git ls-files '*.go') | (! grep .)
	$(GO) vet ./...
	$$(hack/ensure-staticcheck.sh) ./...

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
