#!/usr/bin/env bash
# Measures iperf3 throughput pod-to-pod across the WireGuard cable against the raw underlay veth
# beneath it, in one run (3 interleaved repetitions of 10s each), and writes the medians and their
# ratio to bench/results/throughput-<date>.json and .md. Needs root (network namespaces).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ "$(id -u)" -ne 0 ]; then
	echo "bench: run as root (it creates network namespaces)" >&2
	exit 1
fi
export CABLEMESH_BIN=${CABLEMESH_BIN:-$ROOT/bin}
export CABLEMESH_BENCH_RESULTS=${CABLEMESH_BENCH_RESULTS:-$ROOT/bench/results}
go test -tags bench -run '^TestThroughput$' -v -count=1 -timeout 20m ./bench/
