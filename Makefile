# agentq developer targets. `make test` is what CI runs (.ci/run).

SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c

GO       ?= go
FUZZTIME ?= 20s
LOADGEN  := internal/bench/loadgen

.PHONY: all test test-cluster services vet build loadgen dev fuzz lint chaos chaos-short

all: build

## services: make sure Redis (127.0.0.1:6379) and Postgres (127.0.0.1:5432) answer,
## starting local ones if they are installed (scripts/services.sh).
services:
	bash scripts/services.sh

## test: services, go vet, then the whole test suite with the race detector, then the
## load generator module's own vet and tests (they need no server).
## Tests read AGENTQ_TEST_DATABASE_URL and AGENTQ_TEST_REDIS_URL (see README.md).
test: services
	$(GO) vet ./...
	$(GO) vet -tags cluster .
	$(GO) test -race -count=1 -timeout 12m ./...
	cd $(LOADGEN) && $(GO) vet ./... && $(GO) test -race -count=1 ./...

## test-cluster: the Redis Cluster suite. Each test starts its own local cluster of
## three masters (redis-server --cluster-enabled yes on free ports) and runs agentq's
## roles as separate processes on it; Postgres as for make test.
test-cluster: services
	AGENTQ_REQUIRE_CLUSTER=1 $(GO) test -race -count=1 -tags cluster -timeout 10m -run '^TestCluster' .

vet:
	$(GO) vet ./...
	$(GO) vet -tags cluster .

## build: the agentq binary at bin/agentq.
build:
	$(GO) build -o bin/agentq ./cmd/agentq

## loadgen: the load generator of docs/benchmarks.md at bin/loadgen: agentq over HTTP,
## River and plain asynq under one load. A module of its own (internal/bench/loadgen),
## so that River is no dependency of agentq's.
loadgen:
	cd $(LOADGEN) && $(GO) build -o $(CURDIR)/bin/loadgen .

## dev: everything in one process with demo tenants (see README.md).
dev:
	$(GO) run ./cmd/agentq dev

## fuzz: run every Fuzz function in the module for FUZZTIME each (go test -fuzz takes
## one target per run, so each function gets its own run).
fuzz:
	@found=0; \
	for file in $$(find . -name '*_test.go' -not -path './.git/*' -not -path './vendor/*' | sort); do \
	  pkg="./$$(dirname "$${file#./}")"; \
	  for fn in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$$file"); do \
	    found=1; \
	    echo "== fuzz $$pkg $$fn ($(FUZZTIME))"; \
	    $(GO) test -run='^$$' -fuzz="^$$fn\$$" -fuzztime=$(FUZZTIME) "$$pkg"; \
	  done; \
	done; \
	if [ "$$found" = 0 ]; then echo "fuzz: no Fuzz functions found"; fi

## lint: gofmt, then golangci-lint at a pinned version (.golangci.yml), then go vet of
## the load generator's module (golangci-lint's ./... stops at its go.mod). The first run
## builds golangci-lint into the Go build cache (about two minutes); later runs reuse it.
GOLANGCI_LINT ?= $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
lint:
	@out="$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*' -not -path './vendor/*'))"; \
	if [ -n "$$out" ]; then \
	  echo "These files are not gofmt-formatted (run: gofmt -w <file>):"; echo "$$out"; exit 1; \
	fi; \
	echo "gofmt: ok"
	$(GOLANGCI_LINT) run ./...
	cd $(LOADGEN) && $(GO) vet ./...

## chaos: a scripted fault run (FLUSHDB Redis, kill -9 the server, restart Postgres)
## that fails unless every accepted task ends and no lease leaks (scripts/chaos.sh).
chaos:
	bash scripts/chaos.sh

## chaos-short: the same with fewer tasks, as CI runs it.
chaos-short:
	CHAOS_TASKS=30 bash scripts/chaos.sh
