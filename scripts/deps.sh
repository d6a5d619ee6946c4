#!/usr/bin/env bash
# Installs the host packages airlock needs on Debian 12, only if missing.
# Idempotent; safe to run on every `make demo` / `make test`. gcc is for
# `go test -race` (cgo); protobuf-compiler is the protoc `make generate` pins;
# chromium drives the dashboard's browser test (test/e2e, over CDP);
# firefox-esr drives it again in Firefox (TestDashboardFirefox, over
# WebDriver BiDi with test/firefox's puppeteer-core);
# python3-yaml reads api/openapi.yaml in the Python SDK's spec test;
# postgresql's server binaries run the catalog's PostgreSQL tier (make
# test-postgres starts its own server on a loopback port; the package's
# own cluster is not used).
set -euo pipefail

pkgs=(gcc protobuf-compiler libprotobuf-dev qemu-system-x86 qemu-utils mmdebstrap busybox-static e2fsprogs lz4 xz-utils zstd kmod iproute2 ca-certificates python3 curl python3-ipykernel python3-matplotlib python3-pip python3-setuptools python3-wheel python3-websocket python3-yaml chromium firefox-esr postgresql)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm (MCP, E2B and Firefox dashboard tests): any install will do,
# e.g. nodesource's nodejs carries npm; Debian splits it into its own package.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		echo "deps: missing packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
		exit 1
	fi
	echo "deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v go >/dev/null; then
	echo "deps: Go is required (https://go.dev/dl); /usr/local/go/bin must be on PATH" >&2
	exit 1
fi
# gVisor's runsc for the gvisor runtime (hosts without usable KVM). It must be
# static: runsc re-executes itself inside an empty chroot, where a dynamic
# binary's loader is missing ("fork/exec /proc/self/exe: no such file").
# It is built from a copy of the module with its seccomp filters precompiled
# (scripts/runsc-seccomp/gen.go): a plain `go install` build compiles them at
# every sandbox start, 40-90 ms of CPU each time. RUNSC_BUILD names what is
# installed; a change to either part rebuilds it once.
RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
RUNSC_BUILD="$RUNSC_VERSION seccomp-precompiled-1"
RUNSC=/usr/local/bin/runsc
runsc_ok() {
	[[ -x $RUNSC ]] && [[ $(cat "$RUNSC.version" 2>/dev/null) == "$RUNSC_BUILD" ]]
}
if ! runsc_ok; then
	if [[ $(id -u) -ne 0 ]]; then
		echo "deps: runsc missing; run as root to install it into $RUNSC" >&2
		exit 1
	fi
	echo "deps: building runsc $RUNSC_VERSION (static, seccomp filters precompiled; about 3.5 min)"
	repo=$(cd "$(dirname "$0")/.." && pwd)
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd "$repo" && go mod download "gvisor.dev/gvisor@$RUNSC_VERSION")
	cp -r "$(go env GOMODCACHE)/gvisor.dev/gvisor@$RUNSC_VERSION" "$tmp/gvisor"
	chmod -R u+w "$tmp/gvisor"
	cp "$repo/scripts/runsc-seccomp/gen.go" "$tmp/gvisor/airlock-seccomp-gen.go"
	(cd "$tmp/gvisor" && CGO_ENABLED=0 go run airlock-seccomp-gen.go &&
		CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$tmp/runsc" ./runsc)
	install -m 0755 "$tmp/runsc" "$RUNSC.new"
	mv -f "$RUNSC.new" "$RUNSC"
	echo "$RUNSC_BUILD" >"$RUNSC.version"
	rm -rf "$tmp"
	trap - EXIT
fi
echo "deps: ok ($(qemu-system-x86_64 --version | head -1); $("$RUNSC" --version | head -1))"
