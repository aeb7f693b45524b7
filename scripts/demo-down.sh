#!/usr/bin/env bash
# Tears down the demo mesh of scripts/demo.sh: stops its processes, deletes every network
# namespace named cbldemo-*, removes the demo's cgroups and bpffs, and its state directory. Safe to run when nothing is up.
set -euo pipefail

PREFIX=cbldemo-
STATE=${CABLEMESH_DEMO_DIR:-/tmp/cablemesh-demo}

if [ "$(id -u)" -ne 0 ]; then
	echo "demo-down: run as root (it deletes network namespaces)" >&2
	exit 1
fi

# Agents first, with SIGTERM, so they remove their devices; then whatever is left.
stop_pids() {
	local sig=$1
	shift
	local pid
	for pid in "$@"; do
		kill "-$sig" "$pid" 2>/dev/null || true
	done
}

namespaces=$(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}" || true)
for ns in $namespaces; do
	case $ns in *-gw) stop_pids TERM $(ip netns pids "$ns" 2>/dev/null) ;; esac
done
for _ in $(seq 1 50); do
	left=""
	for ns in $namespaces; do
		case $ns in *-gw) left="$left$(ip netns pids "$ns" 2>/dev/null)" ;; esac
	done
	[ -z "$left" ] && break
	sleep 0.2
done
for ns in $namespaces; do
	stop_pids TERM $(ip netns pids "$ns" 2>/dev/null)
done
sleep 0.5
for ns in $namespaces; do
	stop_pids KILL $(ip netns pids "$ns" 2>/dev/null)
	ip netns del "$ns" 2>/dev/null || true
done
# The services datapath: the cgroups' bind mounts, the cgroups, the bpffs (its pins go with it),
# and the pods' resolv.conf. Nothing is removed through a mount.
for m in "$STATE"/*/cgroup "$STATE"/bpffs; do
	if mountpoint -q "$m" 2>/dev/null; then
		umount -l "$m" || { echo "demo-down: cannot unmount $m; leaving $STATE" >&2; exit 1; }
	fi
done
for root in /sys/fs/cgroup/unified /sys/fs/cgroup; do
	for cg in "$root/${PREFIX}"*; do
		[ -d "$cg" ] || continue
		echo 1 >"$cg/cgroup.kill" 2>/dev/null || true
		for _ in $(seq 1 25); do rmdir "$cg" 2>/dev/null && break; sleep 0.2; done
	done
done
rm -rf /etc/netns/"${PREFIX}"*-pod
rm -rf "$STATE"
echo "demo-down: removed ${namespaces:+$(echo $namespaces | wc -w) namespaces and }$STATE"
