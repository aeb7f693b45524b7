#!/usr/bin/env bash
# `make k8s-demo-down`: removes everything scripts/k8s-demo.sh made: both clusters (every process,
# network namespace, node mount namespace, cgroup and the nodes' iptables rules, which live in the
# node namespaces; tests/k8s/cluster.sh down), the broker and its namespace, the underlay bridge,
# and the state directory. Idempotent: safe to run when nothing, or half of it, is up.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CABLEMESH_K8S_DIR=${CABLEMESH_K8S_DIR:-/tmp/cablemesh-k8s}
STATE=$CABLEMESH_K8S_DIR

[[ $(id -u) == 0 ]] || { echo "k8s-demo-down: run as root" >&2; exit 1; }

for c in east west; do
	"$ROOT/tests/k8s/cluster.sh" down "$c"
done
if [[ -f $STATE/broker.pid ]]; then
	pid=$(<"$STATE/broker.pid")
	if [[ $pid =~ ^[0-9]+$ ]] && kill -TERM "$pid" 2>/dev/null; then
		for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
fi
# Anything left in the broker's namespace (a broker whose pid file was lost).
if [[ -e /run/netns/ck8-broker ]]; then
	for pid in $(ip netns pids ck8-broker 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
	ip netns del ck8-broker
fi
ip link del ck8ul 2>/dev/null || true
# A deleted network namespace is freed by the kernel in the background, and its veth peers in this
# namespace with it: under load that takes seconds, and a demo started at once would find their
# names taken. Delete them here, and wait for the names to go.
links="ck0brk ck1ul ck2ul ck1br ck2br ck1cp ck2cp ck1n1 ck1n2 ck2n1 ck2n2"
for _ in $(seq 1 60); do
	left=""
	for l in $links; do
		if [[ -e /sys/class/net/$l ]]; then
			ip link del "$l" 2>/dev/null || true
			left+=" $l"
		fi
	done
	[[ -z $left ]] && break
	sleep 0.5
done
[[ -z $left ]] || echo "k8s-demo-down: links still present after 30s:$left" >&2
rm -rf "$STATE"
echo "k8s-demo-down: removed the clusters east and west, the broker and $STATE"
