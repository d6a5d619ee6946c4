# airlock: `make demo` and `make test` do everything on a fresh Debian 12 box.
SHELL := /bin/bash
GO ?= go
export PATH := $(PATH):/usr/local/go/bin
STATE_DIR ?= $(or $(AIRLOCK_STATE_DIR),/var/lib/airlock)
# The version stamped into both binaries (`airlock version`) and the dist
# tarball's name: git describe of the tree, a semver tag kept with its v
# (v0.3.0, v0.3.0-4-gabc1234, a bare hash without tags, -dirty with
# uncommitted changes; dev outside git). Evaluated once; `make VERSION=...`
# overrides it.
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# `make install`: binaries under $(DESTDIR)$(PREFIX), the guest agent in
# $(PREFIX)/lib/airlock (where airlock looks for it), the systemd unit in
# UNITDIR, the settings files /etc/airlock/airlock.yaml (serve's config
# file) and /etc/airlock/airlock.env (its environment).
PREFIX ?= /usr/local
DESTDIR ?=
UNITDIR ?= $(PREFIX)/lib/systemd/system
LDFLAGS := -s -w -X main.version=$(VERSION)
AIRLOCK := bin/airlock --state-dir $(STATE_DIR)
# End-to-end tests the gvisor pass of `make test` leaves out (a template that
# saves a Python kernel running: gVisor templates are images).
GVISOR_SKIP := TestCodeWarmPythonFromTemplate
# End-to-end tests only the gvisor pass of `make test` runs: their subject
# is host-side code or the guest image, the same on either runtime (the
# dashboard, the README's examples, the base image's pip; the API's
# tenancy and quotas; the cluster's control tier, node registry, templates
# and warm pools; the secrets proxy; the code-context broker and kernels),
# and under TCG they cost minutes (TestBaseImageHasPip 151 s on qemu,
# TestReadmeExamples 107 s, TestCodeContexts 99 s, TestDashboard 71 s,
# TestAPI 49 s, the five 87 s). What the runtime does for them stays in
# the qemu pass: exec and files through the API (TestRemoteCLI), a Python
# kernel (TestCodeWarmPython*), the guest's network (TestPing*,
# TestLivePolicy*, TestVault*), moves between nodes (TestClusterMoves*,
# TestClusterResumes*), template builds (TestTemplateBuildFromDockerfile).
# `make test-vm` runs them all on QEMU.
GVISOR_ONLY := TestDashboardFirefox|TestDashboardBrowserView|TestDashboard|TestReadmeExamples|TestBaseImageHasPip|TestAPI|TestCodeContexts|TestCodeFirstRunFiguresAndDeath|TestSecretsOverHTTP2WebSocketAndHeaderScope|TestNodeRegistersAndServesTheControlTier|TestClusterControlTierPlacesAndProxies|TestClusterE2BSDK|TestClusterTemplate|TestClusterWarmPool
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

.PHONY: help deps build install uninstall dist test-dist setup demo test test-postgres test-unit test-race test-sdk-unit test-host test-vm kube-bins test-kube bench generate check-generate lint fuzz test-fuzz-short test-security test-browser clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

deps: ## install missing host packages (apt)
	@scripts/deps.sh

build: ## build bin/airlock and the static guest agent bin/airlock-agent
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/airlock-agent ./cmd/airlock-agent
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/airlock ./cmd/airlock

install: build ## install airlock, its guest agent and airlock.service under $(DESTDIR)$(PREFIX); /etc/airlock/airlock.yaml and airlock.env only where none exists
	install -D -m 0755 bin/airlock $(DESTDIR)$(PREFIX)/bin/airlock
	install -D -m 0755 bin/airlock-agent $(DESTDIR)$(PREFIX)/lib/airlock/airlock-agent
	install -d $(DESTDIR)$(UNITDIR)
	sed 's|@BINDIR@|$(PREFIX)/bin|g' packaging/airlock.service >$(DESTDIR)$(UNITDIR)/airlock.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/airlock.service
	@for f in airlock.yaml airlock.env; do \
		if [ -e $(DESTDIR)/etc/airlock/$$f ]; then echo "install: kept $(DESTDIR)/etc/airlock/$$f"; \
		else install -D -m 0644 packaging/$$f $(DESTDIR)/etc/airlock/$$f; fi; \
	done
	@echo "installed airlock $(VERSION); next: airlock setup; systemctl daemon-reload; systemctl enable --now airlock"

uninstall: ## remove what make install put under $(DESTDIR)$(PREFIX) (keeps /etc/airlock and the state dir)
	rm -f $(DESTDIR)$(PREFIX)/bin/airlock $(DESTDIR)$(PREFIX)/lib/airlock/airlock-agent $(DESTDIR)$(UNITDIR)/airlock.service
	[ ! -d $(DESTDIR)$(PREFIX)/lib/airlock ] || rmdir --ignore-fail-on-non-empty $(DESTDIR)$(PREFIX)/lib/airlock

# The tarball is a /usr/local tree (tar -C /usr/local --strip-components=1
# -xzf it): the files of `make install` with PREFIX=/usr/local, the default
# settings in share/airlock, the docs in share/doc/airlock. Reproducible:
# sorted, owned by root, dated by the last commit.
dist: build ## dist/airlock-$(VERSION)-<os>-<arch>.tar.gz: both binaries, airlock.service, airlock.yaml, airlock.env, README.md, docs/
	@set -euo pipefail; name=airlock-$(VERSION)-$$($(GO) env GOOS)-$$($(GO) env GOARCH); stage=dist/$$name; \
	rm -rf $$stage; \
	install -D -m 0755 bin/airlock $$stage/bin/airlock; \
	install -D -m 0755 bin/airlock-agent $$stage/lib/airlock/airlock-agent; \
	install -d $$stage/lib/systemd/system $$stage/share/airlock $$stage/share/doc/airlock; \
	sed 's|@BINDIR@|/usr/local/bin|g' packaging/airlock.service >$$stage/lib/systemd/system/airlock.service; \
	install -m 0644 packaging/airlock.yaml packaging/airlock.env $$stage/share/airlock/; \
	cp -r README.md docs $$stage/share/doc/airlock/; \
	if [ -f LICENSE ]; then cp LICENSE $$stage/share/doc/airlock/; fi; \
	chmod -R u=rwX,go=rX $$stage; \
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@$$(git log -1 --format=%ct 2>/dev/null || echo 0) \
		-C dist -cf - $$name | gzip -n >dist/$$name.tar.gz; \
	rm -rf $$stage; echo dist/$$name.tar.gz

test-dist: ## a temp clone of HEAD tagged v0.0.0-test: make dist (version), make install into a temp root, the unit's serve with the installed config file (TLS) answers /healthz and /v1/openapi.yaml, the Python and Go SDKs install offline
	scripts/test-dist.sh

# The Go tests name their runtime: qemu, and gvisor in make test's second
# pass (the default, auto, would take gvisor for both on a host without KVM).
# The client suites (SDK, MCP, E2B, Playwright) run on auto, the runtime a
# user of this host gets.
test test-vm test-host test-security: export AIRLOCK_RUNTIME ?= qemu
# The suites' sandboxes are thin (a 2 GiB disk takes what it writes), but
# creates and forks are checked against their whole size: a host with a big,
# mostly full filesystem (CI's: 252 GiB, 16 GiB free) keeps 5% of it, 12.6
# GiB, in reserve by default and would refuse them. The tests keep 1 GiB.
test test-vm test-host test-security test-browser: export AIRLOCK_DISK_RESERVE ?= 1G
# make test's steps, each timed (scripts/step.sh) from the run's start.
test: export MAKE_TEST_T0 := $(shell date +%s)
STEP := scripts/step.sh
CLIENT_ENV = AIRLOCK_RUNTIME=auto AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock

setup: deps build ## guest kernel, initramfs and the default image into the state dir
	$(AIRLOCK) setup

demo: setup ## install, build and run a real sandbox
	$(AIRLOCK) run -- python3 -c 'import platform; print("hello from", platform.node(), "kernel", platform.release(), "-> 6*7 =", 6*7)'

test: setup test-sdk-unit ## every tier: lint, generated-code drift, unit with -race, host and vm (TCG here), SDKs, MCP, E2B and browser clients
	$(STEP) "browser image" $(AIRLOCK) setup --browser
	$(STEP) lint $(MAKE) lint
	$(STEP) check-generate $(MAKE) check-generate
	$(STEP) "unit, -race" $(MAKE) test-race
	$(STEP) postgres $(MAKE) test-postgres
	$(STEP) kube-bins $(MAKE) kube-bins
	$(STEP) fuzz $(MAKE) test-fuzz-short
	$(STEP) security $(MAKE) test-security
	# Every tier, the kube one (the cluster's packages, and airlock node in
	# test/e2e) included. The end-to-end suite, the longest package, is
	# named first so that it starts first (go test runs packages in the
	# order given; the others share the second CPU with it).
	$(STEP) "all tiers, qemu" env AIRLOCK_TEST_KUBE_BIN=$(KUBE_BIN) AIRLOCK_TEST_ROOT=1 AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock \
		$(GO) test -count=1 -timeout 40m -skip '^TestThreat|^($(GVISOR_ONLY))$$' ./test/e2e/ ./...
	# The end-to-end suite again on the gvisor runtime, but for what needs
	# a template saved running, which gVisor templates are not; with what
	# runs only here (GVISOR_ONLY). The audit flood (threat 17) is folded
	# by the host's network, the same code on either runtime: the security
	# step floods for 60 s, this pass for 20.
	$(STEP) "end-to-end, gvisor" env AIRLOCK_TEST_FLOOD_SECONDS=20 AIRLOCK_TEST_KUBE_BIN=$(KUBE_BIN) AIRLOCK_RUNTIME=gvisor AIRLOCK_TEST_ROOT=1 AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock \
		$(GO) test -count=1 -timeout 20m -skip '$(GVISOR_SKIP)' ./test/e2e/
	$(STEP) "Go and Python SDKs" env $(CLIENT_ENV) scripts/test-sdk.sh
	$(STEP) "MCP clients" env $(CLIENT_ENV) scripts/test-mcp.sh
	$(STEP) "E2B SDK" env $(CLIENT_ENV) scripts/test-e2b.sh
	$(STEP) "Playwright and Puppeteer" env $(CLIENT_ENV) scripts/test-browser.sh
	$(STEP) dist $(MAKE) test-dist

test-browser: setup ## the browser sandboxes' DevTools endpoint with unmodified Playwright and Puppeteer (builds the browser image if missing)
	$(CLIENT_ENV) scripts/test-browser.sh

test-security: setup ## the adversarial suite: one TestThreatNNN test per threat of THREATS.md that runs here (docs/THREATS-COVERAGE.md), all tiers
	AIRLOCK_TEST_ROOT=1 AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock \
		$(GO) test -count=1 -timeout 30m -run '^TestThreat' ./test/e2e/ ./...

test-unit: test-sdk-unit ## unit tier only (no root, boots nothing)
	$(GO) test -short ./...

test-postgres: ## the catalog's tests again on a real PostgreSQL (Debian's, started in a temp dir on a loopback port)
	AIRLOCK_TEST_POSTGRES=1 $(GO) test -count=1 ./internal/store/

test-race: ## unit tier with the race detector (needs cgo: gcc from make deps)
	CGO_ENABLED=1 $(GO) test -race -short -count=1 ./...

# Debian's python3, where scripts/deps.sh installs the tests' packages
# (python3-yaml, python3-websocket); any python3 where there is none.
SDK_PYTHON := $(firstword $(wildcard /usr/bin/python3) python3)

test-sdk-unit: ## SDK unit tests (Go module sdk/go, Python sdk/python) against in-process fakes
	cd sdk/go && $(GO) vet ./... && $(GO) test -short -count=1 ./...
	$(SDK_PYTHON) -m unittest discover -s sdk/python/tests

test-host: build ## unit + host tier
	AIRLOCK_TEST_ROOT=1 $(GO) test -count=1 ./...

test-vm: setup ## unit + vm tier
	AIRLOCK_TEST_VM=1 AIRLOCK_TEST_STATE_DIR=$(STATE_DIR) AIRLOCK_BIN=$(CURDIR)/bin/airlock $(GO) test -count=1 -timeout 40m ./...

# The kube tier (internal/testutil/kubetest): a real kube-apiserver and etcd,
# built from the Go module proxy once per version (pinned in tools/kube) into
# .cache/tools/kube-<version>-etcd-<version>. Cluster packages join
# KUBE_TEST_PKGS as they arrive.
KUBE_TEST_PKGS := ./internal/testutil/kubetest/... ./internal/cluster/...
# The binaries' directory, for make test's tiers (built by kube-bins first).
KUBE_BIN = $(shell GO=$(GO) scripts/kube-bins.sh)

kube-bins: ## build kube-apiserver and etcd from the Go module proxy into .cache/tools (about 5 min, once per version; versions in tools/kube)
	GO=$(GO) scripts/kube-bins.sh

test-kube: ## the cluster tier against a real kube-apiserver and etcd built from the Go module proxy
	@dir="$$(GO=$(GO) scripts/kube-bins.sh)" && \
	echo "AIRLOCK_TEST_KUBE_BIN=$$dir $(GO) test -count=1 $(KUBE_TEST_PKGS)" && \
	AIRLOCK_TEST_KUBE_BIN="$$dir" $(GO) test -count=1 $(KUBE_TEST_PKGS)

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

# --allow-parallel-runners: golangci-lint otherwise refuses to run while
# any other checkout on the machine lints (one lock file in /tmp).
lint: $(GOLANGCI_LINT) ## gofmt, go vet and golangci-lint (.golangci.yml; pinned, installed on first use)
	@test -z "$$(gofmt -l cmd internal test sdk/go)" || { gofmt -l cmd internal test sdk/go; echo "lint: run gofmt -w"; exit 1; }
	$(GO) vet ./...
	$(GOLANGCI_LINT) run --allow-parallel-runners ./...
	cd sdk/go && $(CURDIR)/$(GOLANGCI_LINT) run --allow-parallel-runners --config $(CURDIR)/.golangci.yml ./...

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
