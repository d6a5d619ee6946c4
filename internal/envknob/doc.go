// Package envknob is the one place where airlock's environment knobs are
// declared: operator settings that have no flag (AIRLOCK_DNS,
// AIRLOCK_UPSTREAM_CA_FILE) and test hooks (AIRLOCK_TEST_DIAL_MAP).
//
// Only commands (cmd/...) read knobs; they pass the values down in a
// package's Config. Library code never reads the environment: the lint
// rule forbidigo refuses os.Getenv and os.LookupEnv outside cmd/, this
// package and tests, so a test hook cannot quietly change the behaviour of
// a library that a different caller (the API server, a test) embeds.
//
// The CLI's own settings (AIRLOCK_STATE_DIR, AIRLOCK_HOST,
// AIRLOCK_API_KEY, AIRLOCK_ACCEL, AIRLOCK_RUNTIME, AIRLOCK_HOST_CGROUPS) are flag defaults and
// are read next to their flags in cmd/airlock. Test-tier gates
// (AIRLOCK_TEST_ROOT, AIRLOCK_TEST_VM, ...) are read by internal/testutil.
package envknob
