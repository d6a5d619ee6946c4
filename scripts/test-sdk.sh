#!/usr/bin/env bash
# Runs the Go and Python SDK test suites against a real `airlock serve` and
# real sandboxes (vm tier). Used by `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${AIRLOCK_BIN:-$PWD/bin/airlock}
STATE=${AIRLOCK_TEST_STATE_DIR:?set AIRLOCK_TEST_STATE_DIR}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
"$BIN" --state-dir "$STATE" serve --listen "127.0.0.1:$port" >"$log" 2>&1 &
pid=$!
key=""
cleanup() {
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	if [[ -n $key ]]; then "$BIN" --state-dir "$STATE" keys revoke "$(cut -d_ -f2 <<<"$key")" >/dev/null 2>&1 || true; fi
	rm -f "$log"
}
trap cleanup EXIT
for _ in $(seq 100); do
	curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
	sleep 0.1
done
curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null || { echo "test-sdk: serve did not start:"; cat "$log"; exit 1; }
key=$("$BIN" --state-dir "$STATE" keys create --tenant "sdk-test-$$" | tail -1)
export AIRLOCK_TEST_API="http://127.0.0.1:$port" AIRLOCK_TEST_API_KEY="$key" AIRLOCK_TEST_VM=1
echo "test-sdk: Go SDK against $AIRLOCK_TEST_API"
(cd sdk/go && go test -count=1 ./...)
# Debian's interpreter: scripts/deps.sh installs the terminal's WebSocket
# client (python3-websocket) and PyYAML (python3-yaml, for test_spec.py,
# which checks the SDK against api/openapi.yaml) for it; another python3
# first on PATH (pyenv) would not see them and those tests would fail.
py=/usr/bin/python3
[[ -x $py ]] || py=python3
echo "test-sdk: Python SDK ($("$py" --version)) against $AIRLOCK_TEST_API"
"$py" -m unittest discover -s sdk/python/tests -v
