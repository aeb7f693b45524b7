#!/usr/bin/env bash
# A new pair's first packets, the previous build and this one side by side (bench/pairstart.md).
# As root. Builds the previous revision (CABLEMESH_START_PREVIOUS_REV, default 98843a3, main before
# the agent registered at once) from a git worktree into CABLEMESH_START_PREVIOUS (default
# /tmp/cablemesh-prev-<rev>) unless its binaries are there, then runs TestPairStart with
# CABLEMESH_START_BUILDS (default before=<that dir>,after=bin). Results: bench/results/pairstart-*.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ "$(id -u)" -ne 0 ]; then
	echo "bench-start: run as root (it creates network namespaces)" >&2
	exit 1
fi
REV=${CABLEMESH_START_PREVIOUS_REV:-98843a3}
PREV=${CABLEMESH_START_PREVIOUS:-/tmp/cablemesh-prev-$REV}
if [ -z "${CABLEMESH_START_BUILDS:-}" ]; then
	if ! [ -x "$PREV/cable-broker" ] || ! [ -x "$PREV/cable-agent" ] || ! [ -x "$PREV/cablectl" ]; then
		src=$(mktemp -d /tmp/cablemesh-prev-src-XXXXXX)
		trap 'git -C "$ROOT" worktree remove --force "$src" >/dev/null 2>&1 || rm -rf "$src"' EXIT
		echo "bench-start: building $REV into $PREV"
		git -C "$ROOT" worktree add --detach "$src" "$REV" >/dev/null
		mkdir -p "$PREV"
		(cd "$src" && go build -o "$PREV/" ./cmd/cable-broker ./cmd/cable-agent ./cmd/cablectl)
	fi
	export CABLEMESH_START_BUILDS="before=$PREV,after=$ROOT/bin"
fi
export CABLEMESH_BIN=${CABLEMESH_BIN:-$ROOT/bin}
export CABLEMESH_BENCH_RESULTS=${CABLEMESH_BENCH_RESULTS:-$ROOT/bench/results}
echo "bench-start: builds $CABLEMESH_START_BUILDS; load average $(cut -d' ' -f1-3 /proc/loadavg)"
go test -tags bench -run '^TestPairStart$' -v -count=1 -timeout 30m ./bench/
