#!/usr/bin/env bash
# Runs every Fuzz target in the module for $1 (a go test -fuzztime, e.g.
# 5s or 1000x). `make test` runs a short budget, `make fuzz` a longer one.
# A failing input is saved under the package's testdata/fuzz/ by go test:
# commit it as a regression seed once the bug is fixed.
set -euo pipefail
budget="${1:?usage: scripts/fuzz.sh FUZZTIME}"
GO="${GO:-go}"
n=0
for pkg in $($GO list ./... ); do
	dir="$($GO list -f '{{.Dir}}' "$pkg")"
	grep -qs '^func Fuzz' "$dir"/*_test.go || continue
	for target in $($GO test -list '^Fuzz' "$pkg" | grep '^Fuzz'); do
		echo "fuzz: $pkg $target ($budget)"
		$GO test -run '^$' -fuzz "^${target}\$" -fuzztime "$budget" "$pkg" | grep -v '^fuzz: elapsed' || exit 1
		n=$((n+1))
	done
done
[ "$n" -gt 0 ] || { echo "fuzz: no targets found" >&2; exit 1; }
echo "fuzz: $n targets passed ($budget each)"
