# airlock: `make demo` and `make test` do everything on a fresh Debian 12 box.
SHELL := /bin/bash
GO ?= go
export PATH := $(PATH):/usr/local/go/bin
STATE_DIR ?= $(or $(AIRLOCK_STATE_DIR),/var/lib/airlock)
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
AIRLOCK := bin/airlock --state-dir $(STATE_DIR)
# End-to-end tests the gvisor pass of `make test` leaves out (pause).
GVISOR_SKIP := TestPauseResume|TestIdlePause|TestForkDiverges|TestSnapshotCreateFrom|TestPausedSurviveRestart

.PHONY: help deps build setup demo test test-unit test-sdk-unit test-host test-vm bench generate lint fuzz clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

deps: ## install missing host packages (apt)
	@scripts/deps.sh

build: ## build bin/airlock and the static guest agent bin/airlock-agent
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/airlock-agent ./cmd/airlock-agent
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/airlock ./cmd/airlock

setup: deps build ## guest kernel, initramfs and the default image into the state dir
	$(AIRLOCK) setup

demo: setup ## install, build and run a real sandbox
	$(AIRLOCK) run -- python3 -c 'import platform; print("hello from", platform.node(), "kernel", platform.release(), "-> 6*7 =", 6*7)'

test: setup test-sdk-unit ## every tier: unit, host and vm (TCG here), SDKs and MCP clients against live servers
	$(GO) vet ./...
	AIRLOCK_TEST_ROOT=1 AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock \
		$(GO) test -count=1 -timeout 40m ./...
	# The end-to-end suite again on the gvisor runtime, but for what needs
	# pause (snapshots, fork), which runsc sandboxes do not do yet.
	AIRLOCK_RUNTIME=gvisor AIRLOCK_TEST_ROOT=1 AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock \
		$(GO) test -count=1 -timeout 20m -skip '$(GVISOR_SKIP)' ./test/e2e/
	AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock scripts/test-sdk.sh
	AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock scripts/test-mcp.sh

test-unit: test-sdk-unit ## unit tier only (no root, boots nothing)
	$(GO) test -short ./...

test-sdk-unit: ## SDK unit tests (Go module sdk/go, Python sdk/python) against in-process fakes
	cd sdk/go && $(GO) vet ./... && $(GO) test -short -count=1 ./...
	python3 -m unittest discover -s sdk/python/tests

test-host: build ## unit + host tier
	AIRLOCK_TEST_ROOT=1 $(GO) test -count=1 ./...

test-vm: setup ## unit + vm tier
	AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock $(GO) test -count=1 -timeout 40m ./...

bench: setup ## latency and memory table (cold run, create->exec, exec RTT, RSS)
	$(AIRLOCK) bench

generate: ## regenerate protobuf/Connect code (needs protoc)
	@command -v protoc >/dev/null || apt-get install -y -q protobuf-compiler
	$(GO) build -o .cache/gen/ google.golang.org/protobuf/cmd/protoc-gen-go connectrpc.com/connect/cmd/protoc-gen-connect-go
	protoc --plugin=protoc-gen-go=.cache/gen/protoc-gen-go --plugin=protoc-gen-connect-go=.cache/gen/protoc-gen-connect-go \
		-I proto --go_out=. --go_opt=module=github.com/airlock-sandbox/airlock \
		--connect-go_out=. --connect-go_opt=module=github.com/airlock-sandbox/airlock \
		proto/airlock/agent/v1/agent.proto proto/airlock/shim/v1/shim.proto proto/airlock/shim/v2/*.proto

lint: ## gofmt and go vet (golangci-lint is not set up yet)
	@test -z "$$(gofmt -l cmd internal test sdk/go)" || { gofmt -l cmd internal test sdk/go; echo "lint: run gofmt -w"; exit 1; }
	$(GO) vet ./...

fuzz: ## fuzz the host side of the agent protocol for 30s
	$(GO) test -run '^$$' -fuzz FuzzClientFromGuest -fuzztime 30s ./internal/agentapi/

clean:
	rm -rf bin .cache
