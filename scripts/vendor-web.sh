#!/usr/bin/env bash
# Vendors the dashboard's third-party web assets into the tree, so that the
# build needs no network: the npm package @xterm/xterm at a pinned version,
# checked against the registry's integrity hash (SRI sha512 of the tarball)
# pinned here, and only lib/xterm.js, css/xterm.css and LICENSE copied into
# internal/dashboard/static/vendor/xterm/. Run it only to change the
# version; commit what it writes (and the new pins).
set -euo pipefail

XTERM_VERSION=6.0.0
XTERM_INTEGRITY=sha512-TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg==

root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/internal/dashboard/static/vendor/xterm
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

(cd "$tmp" && npm pack --silent "@xterm/xterm@$XTERM_VERSION" >/dev/null)
tgz=$tmp/xterm-xterm-$XTERM_VERSION.tgz
got=sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)
if [[ $got != "$XTERM_INTEGRITY" ]]; then
	echo "vendor-web: @xterm/xterm@$XTERM_VERSION integrity $got, want $XTERM_INTEGRITY" >&2
	exit 1
fi
tar -xzf "$tgz" -C "$tmp"
mkdir -p "$dest"
install -m 0644 "$tmp/package/lib/xterm.js" "$dest/xterm.js"
install -m 0644 "$tmp/package/css/xterm.css" "$dest/xterm.css"
install -m 0644 "$tmp/package/LICENSE" "$dest/LICENSE"
echo "@xterm/xterm $XTERM_VERSION $XTERM_INTEGRITY" >"$dest/VERSION"
echo "vendor-web: @xterm/xterm $XTERM_VERSION -> ${dest#"$root"/}"
