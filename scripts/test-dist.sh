#!/usr/bin/env bash
# The install path, end to end, on a temp clone of HEAD (commit first: the
# working tree's changes are not in it), tagged v0.0.0-test:
#   - make dist: the tarball's name and both binaries carry the tag's version;
#   - make install DESTDIR=... PREFIX=/usr: the files land where airlock and
#     systemd look; a second install keeps an edited airlock.yaml and
#     airlock.env;
#   - the installed unit's ExecStart, with the installed airlock.env and
#     the installed airlock.yaml (edited to listen on a free port with TLS,
#     a certificate made here), serves the API over HTTPS (GET /healthz 200,
#     GET /v1/openapi.yaml the spec), logs each request, and stops cleanly on
#     SIGTERM, saying so (no systemd needed; systemd-analyze verify checks
#     the unit where it is present); a config file with an unknown key is
#     refused with its line;
#   - make uninstall removes the files and keeps airlock.yaml and airlock.env;
#   - the Python SDK installs with pip offline (no index, no build
#     isolation) and imports; the Go SDK builds into another module through
#     a replace directive, offline.
# Boots no sandbox; needs no root. Used by `make test` (make test-dist).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
tag=v0.0.0-test
fail() {
	echo "test-dist: FAIL: $*" >&2
	exit 1
}
step() { echo "test-dist: [${SECONDS}s] $*"; }

tmp=$(mktemp -d)
pid=""
cleanup() {
	if [[ -n $pid ]]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

# The make that runs this one (make test) must not hand its variables or
# flags down to the clone's makes.
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u GNUMAKEFLAGS -u VERSION make --no-print-directory -C "$tmp/src" "$@"; }

step "clone HEAD ($(git rev-parse --short HEAD)) and tag it $tag"
git clone -q --no-tags "$src" "$tmp/src"
git -C "$tmp/src" tag "$tag"
[[ $(git -C "$tmp/src" describe --tags --always --dirty) == "$tag" ]] || fail "git describe in the clone is not $tag"

step "make dist"
mk dist >"$tmp/dist.log" 2>&1 || { cat "$tmp/dist.log"; fail "make dist"; }
platform=$(go env GOOS)-$(go env GOARCH)
want="dist/airlock-$tag-$platform.tar.gz"
[[ $(tail -1 "$tmp/dist.log") == "$want" ]] || { cat "$tmp/dist.log"; fail "make dist printed '$(tail -1 "$tmp/dist.log")', want $want"; }
[[ -f $tmp/src/$want ]] || fail "$want not written"
mkdir "$tmp/x"
tar -C "$tmp/x" -xzf "$tmp/src/$want"
x=$tmp/x/airlock-$tag-$platform
for f in bin/airlock lib/airlock/airlock-agent lib/systemd/system/airlock.service share/airlock/airlock.yaml share/airlock/airlock.env \
	share/doc/airlock/README.md share/doc/airlock/docs/ARCHITECTURE.md; do
	[[ -f $x/$f ]] || fail "tarball lacks $f"
done
[[ -x $x/bin/airlock && -x $x/lib/airlock/airlock-agent ]] || fail "tarball binaries are not executable"
out=$("$x/bin/airlock" version) || fail "airlock version (tarball) exited $?"
[[ $out == "airlock $tag ("* ]] || fail "tarball's airlock version says '$out', want airlock $tag (...)"
echo "test-dist: tarball: $out"
# The agent is the guest's PID 1: not run here. Its version is a string in
# its data (-trimpath keeps -ldflags out of its build info).
grep -aqF -- "$tag" "$x/lib/airlock/airlock-agent" || fail "tarball's airlock-agent is not stamped $tag"
go version -m "$x/lib/airlock/airlock-agent" | grep -q "CGO_ENABLED=0" || fail "tarball's airlock-agent is not static (CGO_ENABLED=0)"
grep -qxF "ExecStart=/usr/local/bin/airlock serve --config \${AIRLOCK_CONFIG} \$AIRLOCK_SERVE_ARGS" "$x/lib/systemd/system/airlock.service" ||
	fail "tarball's unit has no ExecStart for /usr/local/bin/airlock"
if grep -rq "@BINDIR@" "$x"; then fail "tarball has an unrendered @BINDIR@"; fi

step "make install DESTDIR=... PREFIX=/usr"
root=$tmp/root
mk install DESTDIR="$root" PREFIX=/usr >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "make install"; }
unit=$root/usr/lib/systemd/system/airlock.service
envf=$root/etc/airlock/airlock.env
conf=$root/etc/airlock/airlock.yaml
for f in "$root/usr/bin/airlock" "$root/usr/lib/airlock/airlock-agent" "$unit" "$envf" "$conf"; do
	[[ -f $f ]] || fail "make install did not write ${f#"$root"}"
done
out=$("$root/usr/bin/airlock" version) || fail "installed airlock version exited $?"
[[ $out == "airlock $tag ("* ]] || fail "installed airlock version says '$out', want airlock $tag (...)"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[[ $exec_start == "/usr/bin/airlock serve "* ]] || fail "installed unit's ExecStart is '$exec_start'"
grep -qxF "EnvironmentFile=-/etc/airlock/airlock.env" "$unit" || fail "installed unit does not read /etc/airlock/airlock.env"
grep -qxF "Environment=AIRLOCK_CONFIG=/etc/airlock/airlock.yaml" "$unit" || fail "installed unit does not pass /etc/airlock/airlock.yaml"
cmp -s "$conf" "$tmp/src/packaging/airlock.yaml" || fail "installed airlock.yaml is not packaging/airlock.yaml"
if command -v systemd-analyze >/dev/null; then
	# The unit as installed, but for the binary's place under DESTDIR.
	sed "s|^ExecStart=/usr/bin/|ExecStart=$root/usr/bin/|" "$unit" >"$tmp/airlock.service"
	v=$(systemd-analyze verify "$tmp/airlock.service" 2>&1) && [[ -z $v ]] || fail "systemd-analyze verify airlock.service: $v"
	step "systemd-analyze verify: clean"
fi
echo "# edited" >>"$envf"
echo "# edited" >>"$conf"
mk install DESTDIR="$root" PREFIX=/usr >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "make install (again)"; }
grep -qx "# edited" "$envf" || fail "a second make install overwrote an existing airlock.env"
grep -qx "# edited" "$conf" || fail "a second make install overwrote an existing airlock.yaml"

step "a config file with an unknown key is refused, naming it and its line"
printf 'version: 1\nlisten: 127.0.0.1:0\nlisen: 127.0.0.1:0\n' >"$tmp/bad.yaml"
rc=0
out=$(AIRLOCK_STATE_DIR=$tmp/state-bad "$root/usr/bin/airlock" serve --config "$tmp/bad.yaml" 2>&1) || rc=$?
[[ $rc != 0 && $out == *"bad.yaml:3: unknown key \"lisen\""* ]] || fail "serve with an unknown config key: exit $rc, '$out'"

step "the unit's command, run by hand with the installed config file (TLS), serves the API"
# The installed airlock.yaml, edited as an admin would: a free loopback
# port, and TLS with a certificate for 127.0.0.1 (paths relative to the
# file). Go's generate_cert.go makes it (the key file mode 0600).
mkdir "$root/etc/airlock/tls"
(cd "$root/etc/airlock/tls" && go run "$(go env GOROOT)/src/crypto/tls/generate_cert.go" --host 127.0.0.1 --ca --ecdsa-curve P256 --duration 1h) \
	>"$tmp/cert.log" 2>&1 || { cat "$tmp/cert.log"; fail "generate a certificate"; }
sed -i 's|^listen: .*|listen: 127.0.0.1:0|' "$conf"
printf 'tls:\n  cert: tls/cert.pem\n  key: tls/key.pem\n' >>"$conf"
state=$tmp/state
log=$tmp/serve.log
(
	# What systemd does: the unit's Environment= defaults, then the
	# EnvironmentFile over them, then ExecStart with ${X} as one word and
	# $X split on whitespace. The state dir is ours; the unit's paths are
	# under DESTDIR. Nothing may set the listen address over the file's.
	unset AIRLOCK_LISTEN AIRLOCK_CONFIG
	while IFS= read -r kv; do export "${kv?}"; done < <(sed -n 's/^Environment=//p' "$unit")
	set -a
	# shellcheck disable=SC1090
	. "$envf"
	set +a
	export AIRLOCK_CONFIG=$root$AIRLOCK_CONFIG AIRLOCK_STATE_DIR=$state
	eval "set -- $exec_start"
	exec "$root$1" "${@:2}"
) >"$log" 2>&1 &
pid=$!
addr=""
for _ in $(seq 100); do
	addr=$(sed -n 's|^airlock API listening on https://||p' "$log")
	[[ -n $addr ]] && break
	kill -0 "$pid" 2>/dev/null || { cat "$log"; fail "airlock serve exited"; }
	sleep 0.1
done
[[ -n $addr ]] || { cat "$log"; fail "airlock serve did not start in 10s (with TLS, from airlock.yaml)"; }
[[ $addr == 127.0.0.1:* && $addr != 127.0.0.1:7070 ]] || fail "serve listens on $addr, not the config file's 127.0.0.1:0"
ca=$root/etc/airlock/tls/cert.pem
code=$(curl -sS --cacert "$ca" -o /dev/null -w '%{http_code}' "https://$addr/healthz") || { cat "$log"; fail "GET https://$addr/healthz: curl failed"; }
[[ $code == 200 ]] || { cat "$log"; fail "GET https://$addr/healthz: $code"; }
curl -sS --cacert "$ca" -o "$tmp/openapi.yaml" "https://$addr/v1/openapi.yaml" || fail "GET https://$addr/v1/openapi.yaml: curl failed"
cmp -s "$tmp/openapi.yaml" "$tmp/src/api/openapi.yaml" || fail "GET /v1/openapi.yaml is not api/openapi.yaml"
[[ -n $(ls -A "$state" 2>/dev/null) ]] || fail "serve did not use AIRLOCK_STATE_DIR $state"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
[[ $rc == 0 ]] || { cat "$log"; fail "airlock serve exited $rc on SIGTERM"; }
for want in "msg=request method=GET path=/healthz status=200" "msg=request method=GET path=/v1/openapi.yaml status=200" \
	'msg="shutting down"' "msg=stopped"; do
	grep -qF -- "$want" "$log" || { cat "$log"; fail "the serve log lacks '$want'"; }
done
echo "test-dist: serve on https://$addr (airlock.yaml): /healthz 200, /v1/openapi.yaml, access and stop lines, SIGTERM exit 0"

step "make uninstall"
mk uninstall DESTDIR="$root" PREFIX=/usr >"$tmp/uninstall.log" 2>&1 || { cat "$tmp/uninstall.log"; fail "make uninstall"; }
for f in /usr/bin/airlock /usr/lib/airlock/airlock-agent /usr/lib/systemd/system/airlock.service; do
	[[ ! -e $root$f ]] || fail "make uninstall left $f"
done
[[ ! -e $root/usr/lib/airlock ]] || fail "make uninstall left /usr/lib/airlock"
[[ -f $envf ]] || fail "make uninstall removed /etc/airlock/airlock.env (settings are kept)"
[[ -f $conf ]] || fail "make uninstall removed /etc/airlock/airlock.yaml (settings are kept)"

step "Python SDK: pip install, offline"
# Debian's python3 (make deps installs python3-pip, -setuptools, -wheel);
# another python3 on PATH (pyenv) may lack wheel, which setuptools needs.
py=${PYTHON:-}
if [[ -z $py ]]; then
	for c in /usr/bin/python3 python3; do
		if "$c" -c 'import setuptools, wheel' 2>/dev/null && "$c" -m pip --version >/dev/null 2>&1; then
			py=$c
			break
		fi
	done
fi
[[ -n $py ]] || fail "no python3 with pip, setuptools and wheel (run make deps: python3-pip)"
"$py" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
	--no-build-isolation --no-index --target "$tmp/py" "$tmp/src/sdk/python" >"$tmp/pip.log" 2>&1 ||
	{ cat "$tmp/pip.log"; fail "pip install sdk/python ($py)"; }
out=$(cd "$tmp" && PYTHONPATH=$tmp/py "$py" -c 'import airlock, importlib.metadata as m; print(airlock.__file__, m.version("airlock-sandbox"), airlock.Client.__name__)') ||
	fail "the installed Python SDK does not import"
[[ $out == "$tmp/py/airlock/__init__.py "*" Client" ]] || fail "imported airlock is not the installed one: $out"
echo "test-dist: python ($py): $out"

step "Go SDK: a module that uses it through replace, offline"
mod=$tmp/gomod
mkdir "$mod"
cat >"$mod/main.go" <<'EOF'
package main

import (
	"fmt"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func main() { fmt.Println(airlock.New("http://127.0.0.1:7070", "e2b_x") != nil) }
EOF
(
	cd "$mod"
	export GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off GOWORK=off
	go mod init example.com/usesdk >/dev/null 2>&1
	go mod edit -replace "github.com/airlock-sandbox/airlock/sdk/go=$tmp/src/sdk/go"
	go mod tidy >/dev/null 2>&1
	go build -o usesdk .
) || fail "a module using the Go SDK through replace does not build"
[[ $("$mod/usesdk") == true ]] || fail "the Go SDK program did not run"

step "ok"
