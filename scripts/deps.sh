#!/usr/bin/env bash
# Installs the host packages airlock needs on Debian 12, only if missing.
# Idempotent; safe to run on every `make demo` / `make test`.
set -euo pipefail

pkgs=(qemu-system-x86 qemu-utils mmdebstrap busybox-static e2fsprogs lz4 xz-utils zstd kmod iproute2 ca-certificates python3 curl python3-ipykernel python3-matplotlib)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm (MCP client tests): any install will do, e.g. nodesource's
# nodejs carries npm; Debian splits it into its own package.
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
echo "deps: ok ($(qemu-system-x86_64 --version | head -1))"
