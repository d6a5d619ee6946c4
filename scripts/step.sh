#!/usr/bin/env bash
# step.sh NAME COMMAND...: run one step of `make test` and say how long it
# took, so a CI log shows where the time goes:
#   make test: [lint] passed in 74 s (at 3 min 10 s)
# The step's exit status is kept. MAKE_TEST_T0 (seconds since the epoch,
# set by make test) gives the time since the whole run began.
set -uo pipefail
name=$1
shift
t0=$(date +%s)
echo "make test: [$name] starting"
"$@"
rc=$?
t1=$(date +%s)
at=""
if [ -n "${MAKE_TEST_T0:-}" ]; then
	s=$((t1 - MAKE_TEST_T0))
	at=" (at $((s / 60)) min $((s % 60)) s)"
fi
if [ "$rc" -eq 0 ]; then
	echo "make test: [$name] passed in $((t1 - t0)) s$at"
else
	echo "make test: [$name] FAILED (exit $rc) after $((t1 - t0)) s$at" >&2
fi
exit "$rc"
