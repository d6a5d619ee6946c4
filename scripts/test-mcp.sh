#!/usr/bin/env bash
# Runs the MCP tests with the official TypeScript MCP SDK (test/mcp) against
# `airlock mcp` (stdio) and /mcp of `airlock serve` (streamable HTTP), with
# real sandboxes (vm tier): AIRLOCK_TEST_STATE_DIR must be a state dir
# prepared by `airlock setup`. Needs node >= 20 and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
export AIRLOCK_BIN=${AIRLOCK_BIN:-$PWD/bin/airlock}
: "${AIRLOCK_TEST_STATE_DIR:?set AIRLOCK_TEST_STATE_DIR}"
[[ -x $AIRLOCK_BIN ]] || { echo "test-mcp: $AIRLOCK_BIN is missing (make build)"; exit 1; }
"$AIRLOCK_BIN" --state-dir "$AIRLOCK_TEST_STATE_DIR" setup --browser # the browser tools' sandboxes
cd test/mcp
npm ci --no-audit --no-fund --loglevel=error
echo "test-mcp: MCP TypeScript SDK $(node -p 'require("./node_modules/@modelcontextprotocol/sdk/package.json").version') against $AIRLOCK_BIN"
exec node --test --test-concurrency=1 --test-timeout=900000 mcp.test.mjs
