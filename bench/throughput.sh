#!/usr/bin/env bash
# Cablemesh benchmarks, as root (they build meshes of network namespaces):
#   TestDrivers     pod-to-pod iperf3 throughput (3 runs of 10s, median) and ping RTT (20 pings,
#                   median) over each cable driver (wireguard, vxlan, ipsec), each interleaved run
#                   by run with the raw underlay between the same gateways, in one run; ratios to
#                   bench/results/drivers-<date>.json and .md.
#   TestThroughput  the issue-2 figure: WireGuard vs underlay, bench/results/throughput-<date>.*
#   TestWireGuardStart  50 fresh two-cluster meshes idle and 50 with both CPUs busy: time from the
#                   second agent's start to a pod-to-pod ping answered both ways (bench/results/wgstart-*)
#   TestWireGuardSpeed  pod-to-pod iperf3: plain routing, standalone wireguard-go configured by wg,
#                   the cable and the VXLAN cable, interleaved, with TUN/UDP offload state (wgspeed-*)
#   TestCables      the cables against hand-made VXLAN, wireguard-go and charon and plain routing,
#                   interleaved per round (make bench-cables; bench/results/cables-*)
# BENCH_RUN selects (a go test -run pattern); default the first four.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ "$(id -u)" -ne 0 ]; then
	echo "bench: run as root (it creates network namespaces)" >&2
	exit 1
fi
export CABLEMESH_BIN=${CABLEMESH_BIN:-$ROOT/bin}
export CABLEMESH_BENCH_RESULTS=${CABLEMESH_BENCH_RESULTS:-$ROOT/bench/results}
go test -tags bench -run "${BENCH_RUN:-^(TestDrivers|TestThroughput|TestWireGuardStart|TestWireGuardSpeed)\$}" -v -count=1 -timeout 90m ./bench/
