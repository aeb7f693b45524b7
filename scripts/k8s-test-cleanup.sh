#!/usr/bin/env bash
# scripts/k8s-test-cleanup.sh DIR: removes whatever the k8s stage's tests left under DIR (their
# CABLEMESH_K8S_TEST_DIR) when a run failed or timed out before its own cleanup ran: the
# two-cluster mesh of TestCrossCluster (scripts/k8s-demo-down.sh) and every cluster of
# tests/k8s/cluster.sh (TestCluster's). Idempotent; removes DIR at the end.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: k8s-test-cleanup.sh DIR}
[[ $(id -u) == 0 ]] || { echo "k8s-test-cleanup: run as root" >&2; exit 1; }
[[ -d $dir ]] || exit 0

# Each test keeps its state in DIR/<test>/<n>: a mesh has broker/, a lone cluster only NAME/index.
for state in "$dir"/*/*/; do
	state=${state%/}
	[[ -d $state ]] || continue
	if [[ -d $state/broker || -f $state/broker.pid ]]; then
		CABLEMESH_K8S_DIR=$state "$ROOT/scripts/k8s-demo-down.sh" >/dev/null
		continue
	fi
	for idx in "$state"/*/index; do
		[[ -f $idx ]] || continue
		CABLEMESH_K8S_DIR=$state "$ROOT/tests/k8s/cluster.sh" down "$(basename "$(dirname "$idx")")"
	done
done
if grep -q " $dir/" /proc/self/mountinfo; then
	echo "k8s-test-cleanup: mounts remain under $dir; not removing it" >&2
	exit 1
fi
rm -rf "$dir"
