#!/usr/bin/env bash
# Installs the system tools the netns tests, the demo and the benchmark need (iperf3, ping, ip and
# bridge, strongSwan's charon and swanctl for the ipsec cable), only those that are missing.
# Idempotent and non-interactive; a no-op on a machine that has them.
set -euo pipefail

need=()
command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
# ip and bridge (the netns tests read VXLAN FDB entries with `bridge fdb`) both come with iproute2.
if ! command -v ip >/dev/null 2>&1 || ! command -v bridge >/dev/null 2>&1; then
	need+=(iproute2)
fi
# The ipsec cable driver: charon, its vici plugin, kernel-libipsec (userspace ESP where the kernel
# has none) and the openssl plugin. See cable/ipsec/DEPENDENCIES.md.
[ -x /usr/lib/ipsec/charon ] || need+=(strongswan-charon)
command -v swanctl >/dev/null 2>&1 || need+=(strongswan-swanctl)
[ -e /usr/lib/ipsec/plugins/libstrongswan-kernel-libipsec.so ] || need+=(libcharon-extra-plugins)
[ -e /usr/lib/ipsec/plugins/libstrongswan-openssl.so ] || need+=(libstrongswan-standard-plugins)

# DNS: dig for the tests and the demo; dnsmasq (the -base package: no system service on port 53) and
# dnsperf for the DNS benchmark's anchor and load.
command -v dig >/dev/null 2>&1 || need+=(bind9-dnsutils)
command -v dnsmasq >/dev/null 2>&1 || need+=(dnsmasq-base)
command -v dnsperf >/dev/null 2>&1 || need+=(dnsperf)
# HA on etcd: the etcd store's tests and tests/netns/ha_test.go run real etcd members; etcdctl
# lets the HA test find the etcd leader to kill.
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
# eBPF: clang and llvm-strip rebuild the committed objects (make generate; make test checks they
# are current), libbpf-dev and linux-libc-dev hold the headers, bpftool is for inspecting them.
command -v clang >/dev/null 2>&1 || need+=(clang)
command -v llvm-strip >/dev/null 2>&1 || need+=(llvm)
[ -e /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
[ -e /usr/include/linux/bpf.h ] || need+=(linux-libc-dev)
command -v bpftool >/dev/null 2>&1 || need+=(bpftool)

# The VM stage (tests/vm): qemu, kmod (depmod for the guest kernel's modules; the guest's modprobe),
# and wg (the tests read the guest's kernel WireGuard devices with it).
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v depmod >/dev/null 2>&1 || need+=(kmod)
command -v wg >/dev/null 2>&1 || need+=(wireguard-tools)

# The deploy tests: kubectl (apply --dry-run=client of the install output), systemd-analyze
# (verify the units), iptables (the diagnose netns test firewalls a cable port with it).
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v iptables >/dev/null 2>&1 || need+=(iptables)

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "install-deps: missing ${need[*]}; run as root (or install them) to continue" >&2
		exit 1
	fi
	echo "install-deps: installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The guest kernel of the VM stage: Debian's linux-image-amd64, unpacked (not installed) under
# /var/lib/cablemesh/vm-kernel; a no-op when one is there.
"$(dirname "$0")/vm/install-kernel.sh"
