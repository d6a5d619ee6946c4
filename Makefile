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
# Pinned tools. golangci-lint is built once per version into .cache/tools
# (a fresh clone installs it on the first `make lint`). protoc is Debian 12's
# protobuf-compiler (scripts/deps.sh); the Go plugins are the versions in
# go.mod (its tool directives).
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := .cache/tools/golangci-lint-$(GOLANGCI_LINT_VERSION)/golangci-lint
PROTOC_VERSION := 3.21.12
# Generated code (check-generate diffs it): the protocol packages, and any
# .pb.go / .connect.go a new proto's go_package puts elsewhere.
GENERATED := internal/agentapi internal/shimapi ':(glob)**/*.pb.go' ':(glob)**/*.connect.go'

.PHONY: help deps build setup demo test test-unit test-race test-sdk-unit test-host test-vm bench generate check-generate lint fuzz test-fuzz-short test-security clean

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

test: setup test-sdk-unit ## every tier: lint, generated-code drift, unit with -race, host and vm (TCG here), SDKs, MCP and E2B clients
	$(MAKE) lint
	$(MAKE) check-generate
	$(MAKE) test-race
	$(MAKE) test-fuzz-short
	$(MAKE) test-security
	AIRLOCK_TEST_ROOT=1 AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock \
		$(GO) test -count=1 -timeout 40m -skip '^TestThreat' ./...
	# The end-to-end suite again on the gvisor runtime, but for what needs
	# pause (snapshots, fork), which runsc sandboxes do not do yet.
	AIRLOCK_RUNTIME=gvisor AIRLOCK_TEST_ROOT=1 AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock \
		$(GO) test -count=1 -timeout 20m -skip '$(GVISOR_SKIP)' ./test/e2e/
	AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock scripts/test-sdk.sh
	AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock scripts/test-mcp.sh
	AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock scripts/test-e2b.sh

test-security: setup ## the adversarial suite: one TestThreatNNN test per threat of THREATS.md that runs here (docs/THREATS-COVERAGE.md), all tiers
	AIRLOCK_TEST_ROOT=1 AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock \
		$(GO) test -count=1 -timeout 30m -run '^TestThreat' ./...

test-unit: test-sdk-unit ## unit tier only (no root, boots nothing)
	$(GO) test -short ./...

test-race: ## unit tier with the race detector (needs cgo: gcc from make deps)
	CGO_ENABLED=1 $(GO) test -race -short -count=1 ./...

test-sdk-unit: ## SDK unit tests (Go module sdk/go, Python sdk/python) against in-process fakes
	cd sdk/go && $(GO) vet ./... && $(GO) test -short -count=1 ./...
	python3 -m unittest discover -s sdk/python/tests

test-host: build ## unit + host tier
	AIRLOCK_TEST_ROOT=1 $(GO) test -count=1 ./...

test-vm: setup ## unit + vm tier
	AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock $(GO) test -count=1 -timeout 40m ./...

bench: setup ## latency and memory table (cold run, create->exec, exec RTT, RSS)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/airlock-bench ./cmd/airlock-bench
	bin/airlock-bench --airlock bin/airlock --state-dir $(STATE_DIR)

generate: ## regenerate protobuf/Connect code from every .proto under proto/ (pinned protoc and plugins)
	@command -v protoc >/dev/null && [ -f /usr/include/google/protobuf/timestamp.proto ] || apt-get install -y -q protobuf-compiler libprotobuf-dev
	@v="$$(protoc --version)"; [ "$$v" = "libprotoc $(PROTOC_VERSION)" ] || { \
		echo "generate: need protoc $(PROTOC_VERSION) (Debian 12's protobuf-compiler), found '$$v': the generated code would differ" >&2; exit 1; }
	$(GO) build -o .cache/gen/ google.golang.org/protobuf/cmd/protoc-gen-go connectrpc.com/connect/cmd/protoc-gen-connect-go
	protoc --plugin=protoc-gen-go=.cache/gen/protoc-gen-go --plugin=protoc-gen-connect-go=.cache/gen/protoc-gen-connect-go \
		-I proto -I /usr/include --go_out=. --go_opt=module=github.com/airlock-sandbox/airlock \
		--connect-go_out=. --connect-go_opt=module=github.com/airlock-sandbox/airlock \
		$$(find proto -name '*.proto' | LC_ALL=C sort)

check-generate: generate ## fail if the committed generated code differs from what `make generate` writes
	@git diff --exit-code --stat -- $(GENERATED) || { echo "check-generate: generated code is stale: run make generate and commit" >&2; exit 1; }
	@untracked="$$(git ls-files --others --exclude-standard -- $(GENERATED))"; [ -z "$$untracked" ] || { \
		echo "check-generate: generated files not committed: $$untracked" >&2; exit 1; }

$(GOLANGCI_LINT):
	GOBIN=$(CURDIR)/$(dir $(GOLANGCI_LINT)) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

lint: $(GOLANGCI_LINT) ## gofmt, go vet and golangci-lint (.golangci.yml; pinned, installed on first use)
	@test -z "$$(gofmt -l cmd internal test sdk/go)" || { gofmt -l cmd internal test sdk/go; echo "lint: run gofmt -w"; exit 1; }
	$(GO) vet ./...
	$(GOLANGCI_LINT) run ./...
	cd sdk/go && $(CURDIR)/$(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...

FUZZTIME ?= 60s
fuzz: ## every fuzz target (API bodies, MCP transport, DNS, secret interceptor, agent protocol, policy), $(FUZZTIME) each
	GO=$(GO) scripts/fuzz.sh $(FUZZTIME)

# A count, not a time: with a time budget of a few seconds, Go's fuzzing
# coordinator failed a target with "context deadline exceeded" when the
# machine was busy (the budget ran out during its baseline run).
test-fuzz-short: ## every fuzz target for a short budget, 1000 inputs each (part of make test)
	GO=$(GO) scripts/fuzz.sh 1000x

clean:
	rm -rf bin .cache
