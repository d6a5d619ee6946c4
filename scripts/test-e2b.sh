#!/usr/bin/env bash
# Runs the E2B-compatibility tests (every test/e2b/*.test.mjs) with the official E2B SDKs (test/e2b,
# `e2b` on npm in two versions, `@e2b/code-interpreter`) against `airlock serve`, with real sandboxes
# (vm tier): AIRLOCK_TEST_STATE_DIR must be a state dir prepared by
# `airlock setup`. Needs node >= 20 and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
export AIRLOCK_BIN=${AIRLOCK_BIN:-$PWD/bin/airlock}
: "${AIRLOCK_TEST_STATE_DIR:?set AIRLOCK_TEST_STATE_DIR}"
[[ -x $AIRLOCK_BIN ]] || { echo "test-e2b: $AIRLOCK_BIN is missing (make build)"; exit 1; }
cd test/e2b
npm ci --no-audit --no-fund --loglevel=error
echo "test-e2b: e2b $(node -p 'require("./node_modules/e2b/package.json").version') and $(node -p 'require("./node_modules/e2b-2-45/package.json").version'), @e2b/code-interpreter $(node -p 'require("./node_modules/@e2b/code-interpreter/package.json").version') against $AIRLOCK_BIN"
exec node --test --test-concurrency=1 --test-timeout=900000 ./*.test.mjs
