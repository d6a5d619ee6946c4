#!/usr/bin/env bash
# The install path, end to end, on a temp clone of HEAD (commit first: the
# working tree's changes are not in it), tagged v0.0.0-test:
#   - make dist: the tarball's name and both binaries carry the tag's version;
#   - make install DESTDIR=... PREFIX=/usr: the files land where airlock and
#     systemd look; a second install keeps an edited airlock.env;
#   - the installed unit's ExecStart, with the installed airlock.env, serves
#     the API (GET /healthz 200) and stops cleanly on SIGTERM (no systemd
#     needed; systemd-analyze verify checks the unit where it is present);
#   - make uninstall removes the files and keeps airlock.env;
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
for f in bin/airlock lib/airlock/airlock-agent lib/systemd/system/airlock.service share/airlock/airlock.env \
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
grep -qxF "ExecStart=/usr/local/bin/airlock serve --listen \${AIRLOCK_LISTEN} \$AIRLOCK_SERVE_ARGS" "$x/lib/systemd/system/airlock.service" ||
	fail "tarball's unit has no ExecStart for /usr/local/bin/airlock"
if grep -rq "@BINDIR@" "$x"; then fail "tarball has an unrendered @BINDIR@"; fi

step "make install DESTDIR=... PREFIX=/usr"
root=$tmp/root
mk install DESTDIR="$root" PREFIX=/usr >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "make install"; }
unit=$root/usr/lib/systemd/system/airlock.service
envf=$root/etc/airlock/airlock.env
for f in "$root/usr/bin/airlock" "$root/usr/lib/airlock/airlock-agent" "$unit" "$envf"; do
	[[ -f $f ]] || fail "make install did not write ${f#"$root"}"
done
out=$("$root/usr/bin/airlock" version) || fail "installed airlock version exited $?"
[[ $out == "airlock $tag ("* ]] || fail "installed airlock version says '$out', want airlock $tag (...)"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[[ $exec_start == "/usr/bin/airlock serve "* ]] || fail "installed unit's ExecStart is '$exec_start'"
grep -qxF "EnvironmentFile=-/etc/airlock/airlock.env" "$unit" || fail "installed unit does not read /etc/airlock/airlock.env"
if command -v systemd-analyze >/dev/null; then
	# The unit as installed, but for the binary's place under DESTDIR.
	sed "s|^ExecStart=/usr/bin/|ExecStart=$root/usr/bin/|" "$unit" >"$tmp/airlock.service"
	v=$(systemd-analyze verify "$tmp/airlock.service" 2>&1) && [[ -z $v ]] || fail "systemd-analyze verify airlock.service: $v"
	step "systemd-analyze verify: clean"
fi
echo "# edited" >>"$envf"
mk install DESTDIR="$root" PREFIX=/usr >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "make install (again)"; }
grep -qx "# edited" "$envf" || fail "a second make install overwrote an existing airlock.env"

step "the unit's command, run by hand, serves /healthz"
state=$tmp/state
log=$tmp/serve.log
(
	# What systemd does: the unit's Environment= defaults, then the
	# EnvironmentFile over them, then ExecStart with ${X} as one word and
	# $X split on whitespace. The state dir and a free port are ours.
	while IFS= read -r kv; do export "${kv?}"; done < <(sed -n 's/^Environment=//p' "$unit")
	set -a
	# shellcheck disable=SC1090
	. "$envf"
	set +a
	export AIRLOCK_LISTEN=127.0.0.1:0 AIRLOCK_STATE_DIR=$state
	eval "set -- $exec_start"
	exec "$root$1" "${@:2}"
) >"$log" 2>&1 &
pid=$!
addr=""
for _ in $(seq 100); do
	addr=$(sed -n 's|^airlock API listening on http://||p' "$log")
	[[ -n $addr ]] && break
	kill -0 "$pid" 2>/dev/null || { cat "$log"; fail "airlock serve exited"; }
	sleep 0.1
done
[[ -n $addr ]] || { cat "$log"; fail "airlock serve did not start in 10s"; }
code=$(curl -sS -o /dev/null -w '%{http_code}' "http://$addr/healthz") || fail "GET http://$addr/healthz: curl failed"
[[ $code == 200 ]] || { cat "$log"; fail "GET http://$addr/healthz: $code"; }
[[ -n $(ls -A "$state" 2>/dev/null) ]] || fail "serve did not use AIRLOCK_STATE_DIR $state"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
[[ $rc == 0 ]] || { cat "$log"; fail "airlock serve exited $rc on SIGTERM"; }
echo "test-dist: serve on $addr: /healthz 200, SIGTERM exit 0"

step "make uninstall"
mk uninstall DESTDIR="$root" PREFIX=/usr >"$tmp/uninstall.log" 2>&1 || { cat "$tmp/uninstall.log"; fail "make uninstall"; }
for f in /usr/bin/airlock /usr/lib/airlock/airlock-agent /usr/lib/systemd/system/airlock.service; do
	[[ ! -e $root$f ]] || fail "make uninstall left $f"
done
[[ ! -e $root/usr/lib/airlock ]] || fail "make uninstall left /usr/lib/airlock"
[[ -f $envf ]] || fail "make uninstall removed /etc/airlock/airlock.env (settings are kept)"

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
	export GOFLAGS=-mod=mod GOPROXY=off GOWORK=off
	go mod init example.com/usesdk >/dev/null 2>&1
	go mod edit -replace "github.com/airlock-sandbox/airlock/sdk/go=$tmp/src/sdk/go"
	go mod tidy >/dev/null 2>&1
	go build -o usesdk .
) || fail "a module using the Go SDK through replace does not build"
[[ $("$mod/usesdk") == true ]] || fail "the Go SDK program did not run"

step "ok"
