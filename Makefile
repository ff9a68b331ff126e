# fence's tasks. `make help` lists them.
SHELL := bash
GO ?= go
TOOL := $(GO) tool -modfile=tools/go.mod
FUZZTIME ?= 20s
# Minimizing a new interesting input may take 60s by default, which would
# spend a short FUZZTIME on minimizing instead of fuzzing.
FUZZMINTIME ?= 5s
VERIFY_TIME ?= 10m
# Every binary the Makefile builds says which commit it is (--version,
# cluster status, fence_build_info), even where GOFLAGS holds
# -buildvcs=false, which turns the go command's own record off: the linker
# sets internal/version's stamps from git. --no-optional-locks: git status
# then takes no lock on the index, which another git command may hold.
VERSION_PKG := github.com/fence-dev/fence/internal/version
VERSION_LDFLAGS := -X $(VERSION_PKG).stampRevision=$(shell git rev-parse HEAD 2>/dev/null) \
  -X $(VERSION_PKG).stampTime=$(shell git show -s --format=%cI HEAD 2>/dev/null) \
  -X $(VERSION_PKG).stampModified=$(if $(shell git --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null),true,false) \
  -X $(VERSION_PKG).stampVersion=$(shell git describe --tags 2>/dev/null)
GOBUILD := $(GO) build -ldflags='$(VERSION_LDFLAGS)'
# go test -json → one line per package as it finishes, failures in full.
TESTPROGRESS := $(GO) run ./scripts/testprogress -trim github.com/fence-dev/fence/
# test-short leaves out what needs the servers of `make services` (pgxguard,
# redisguard, s3guard, sqlguard's postgres and mysql subtests, fencecheck's fault runs
# on PostgreSQL) and the tests that kill, cut off and restart real fenced
# processes for minutes. `make test` runs them all. How long each takes:
# README.md, the one place the times are kept.
SHORT_SKIP_PKGS := /guard/pgxguard$$|/guard/redisguard$$|/guard/s3guard$$|/guard/sqlguard$$
SHORT_SKIP := ^(TestCrashRestart|TestRestartGrace|TestCluster.*|TestStorageFaults.*|TestRestoredCopy|TestFencedRunPasses|TestUnfencedRunFindsAnomalies)$$

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: services
services: ## install (Debian packages, when missing) and start PostgreSQL, MariaDB, Redis and S3 (SeaweedFS, built once) on 127.0.0.1 (ports 54329, 33069, 63799, 18339); install chromium, Node.js and npm, and Debian's python3 packages the Python tests use
	./scripts/services.sh

.PHONY: services-stop
services-stop: ## stop the servers make services started from this checkout (their data stays in .services/)
	./scripts/services.sh stop

# The whole suite's time (README.md keeps it) goes mostly to cmd/fenced's
# cluster and kill -9 tests, cmd/fencecheck's fault runs (two of 20
# seconds, one of 24 with only the storage faults), cmd/fenced's storage
# fault tests and the database tests, after lint, checkgenerate and npm ci.
.PHONY: test
test: services lint checkgenerate test-ts test-py ## lint, check generated code, the whole suite with the race detector (times: README.md), a line per package
	set -a && source scripts/services.env && set +a && set -o pipefail && \
	  { $(GO) test -race -count=1 -timeout 20m -json ./... && \
	    (cd bench && $(GO) test -race -count=1 -timeout 5m -json ./...); } | $(TESTPROGRESS)

.PHONY: test-ts
test-ts: services ## the TypeScript client and guards (clients/typescript): npm ci, build, node --test against a real fenced and the servers of make services
	set -a && source scripts/services.env && set +a && cd clients/typescript && \
	  npm ci --no-audit --no-fund --prefer-offline && npm test

# Debian's own interpreter, which make services gives python3-cryptography,
# python3-psycopg2, python3-pymysql and python3-redis: a python3 earlier on PATH (pyenv, a
# venv) may lack them.
PYTHON ?= /usr/bin/python3

.PHONY: test-py
test-py: services ## the Python client and guards (clients/python): unittest against a real fenced and the servers of make services
	$(GOBUILD) -o clients/python/build/bin/ ./cmd/fenced ./cmd/fencectl
	set -a && source scripts/services.env && set +a && cd clients/python && \
	  FENCED_BIN=$$PWD/build/bin/fenced FENCECTL_BIN=$$PWD/build/bin/fencectl PYTHONPATH=src \
	  $(PYTHON) -m unittest discover -s tests

.PHONY: test-short
test-short: ## a first look: no databases, no race detector, no cluster, kill or fault-run tests
	@set -o pipefail; pkgs=$$($(GO) list ./... | grep -Ev '$(SHORT_SKIP_PKGS)'); \
	{ $(GO) test -short -count=1 -timeout 10m -json -skip '$(SHORT_SKIP)' $$pkgs; \
	  $(GO) test -short -count=1 -timeout 10m -json -skip '/^(postgres|mysql)$$' ./guard/sqlguard; } | $(TESTPROGRESS)

.PHONY: test-long
test-long: services ## the cluster and crash tests at length (30 cluster kills, 100 single-node kill -9s, a million scopes churned)
	FENCE_LONG=1 $(GO) test -count=1 -timeout 60m -run 'TestCluster|TestCrash|TestScopeChurn' -v ./cmd/fenced

.PHONY: generate
generate: ## regenerate the protobuf and connect code from api/
	$(TOOL) buf generate

.PHONY: checkgenerate
checkgenerate: generate ## fail if the committed generated code is stale
	git diff --exit-code -- api/

.PHONY: lint
lint: ## gofmt, go vet, staticcheck and buf lint
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(TOOL) staticcheck ./...
	$(TOOL) buf lint

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME each (default 20s); a package that does not build fails it
	@set -e; pkgs=$$($(GO) list ./...); for pkg in $$pkgs; do \
	  list=$$($(GO) test -list '^Fuzz' $$pkg) || { echo "$$list"; echo "fuzz: cannot list the fuzz targets of $$pkg"; exit 1; }; \
	  for f in $$(echo "$$list" | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINTIME) $$pkg; \
	  done; \
	done

.PHONY: bench
bench: ## run the Go benchmarks (acquire+release and renew through a real server)
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./client/

.PHONY: bench-peers
bench-peers: services ## fenced beside etcd and Redis locks, measured side by side (bench/; ~20 min; BENCH_TIME=2s shortens it)
	$(GOBUILD) -o bench/bin/fenced ./cmd/fenced
	cd bench && $(GOBUILD) -o bin/peers ./cmd/peers
	set -a && source scripts/services.env && set +a && cd bench && ./bin/peers -fenced bin/fenced -out results

.PHONY: bench-scale
bench-scale: ## one fenced node holding 100,000 and 1,000,000 leases: RSS, acquire latency, snapshot, restore; 100,000 expiries at once (~10 min)
	$(GOBUILD) -o bench/bin/fenced ./cmd/fenced
	cd bench && $(GOBUILD) -o bin/peers ./cmd/peers
	cd bench && ./bin/peers scale -fenced bin/fenced -out results

.PHONY: bench-cluster
bench-cluster: ## three fenced nodes beside three etcd members: lock cycle, hand-off, renewals, failover after kill -9 of the leader (bench/; ~11 min; BENCH_TIME=2s shortens it)
	$(GOBUILD) -o bench/bin/fenced ./cmd/fenced
	cd bench && $(GOBUILD) -o bin/peers ./cmd/peers
	cd bench && ./bin/peers cluster -fenced bin/fenced -out results

.PHONY: build
build: ## build fenced, fencectl and fencecheck into bin/
	$(GOBUILD) -o bin/ ./cmd/...

# Not in help: internal/version's test builds with these flags, as build does.
.PHONY: version-ldflags
version-ldflags:
	@echo '$(VERSION_LDFLAGS)'

.PHONY: verify
verify: services build ## fencecheck for VERIFY_TIME (10m): 3 fenced nodes, every fault, guard on (VERIFY_FLAGS adds flags)
	set -a && source scripts/services.env && set +a && rm -rf bin/verify && bin/fencecheck run --time $(VERIFY_TIME) --nodes 3 --faults all --dir bin/verify $(VERIFY_FLAGS)
