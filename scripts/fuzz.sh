#!/usr/bin/env bash
# Runs every fuzz target of the module (each `func FuzzX` in a _test.go file) for FUZZTIME each,
# one after another, and stops at the first that fails. Usage: scripts/fuzz.sh [FUZZTIME]
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-${FUZZTIME:-60s}}
go=${GO:-go}
targets=$(grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r f; do
	for n in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //'); do
		echo "$(dirname "$f") $n"
	done
done)
count=$(wc -l <<<"$targets")
i=0
while read -r dir name; do
	i=$((i + 1))
	echo "== [$i/$count] $name ($dir, $fuzztime)"
	# From the package's directory: tests/k8s is a module of its own.
	(cd "$dir" && "$go" test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" .)
done <<<"$targets"
echo "all $count fuzz targets ran for $fuzztime each"
