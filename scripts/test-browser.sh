#!/usr/bin/env bash
# Runs the browser tests (test/browser) with unmodified Playwright and
# Puppeteer (playwright-core and puppeteer-core on npm: no browser
# downloads) against `airlock serve`, with real browser sandboxes (vm
# tier): AIRLOCK_TEST_STATE_DIR must be a state dir prepared by `airlock
# setup`; this builds its browser image if it is missing (about 2 minutes).
# Needs node >= 20 and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
export AIRLOCK_BIN=${AIRLOCK_BIN:-$PWD/bin/airlock}
: "${AIRLOCK_TEST_STATE_DIR:?set AIRLOCK_TEST_STATE_DIR}"
[[ -x $AIRLOCK_BIN ]] || { echo "test-browser: $AIRLOCK_BIN is missing (make build)"; exit 1; }
"$AIRLOCK_BIN" --state-dir "$AIRLOCK_TEST_STATE_DIR" setup --browser
cd test/browser
npm ci --no-audit --no-fund --loglevel=error
(cd ../e2b && npm ci --no-audit --no-fund --loglevel=error) # serve.mjs is shared
echo "test-browser: playwright-core $(node -p 'require("./node_modules/playwright-core/package.json").version'), puppeteer-core $(node -p 'require("./node_modules/puppeteer-core/package.json").version') against $AIRLOCK_BIN"
exec node --test --test-concurrency=1 --test-timeout=900000 browser.test.mjs
