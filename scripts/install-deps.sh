#!/usr/bin/env bash
# Installs the external programs of scripts/deps.list (the one list: program, Debian package,
# stages) that the given profiles need and that are missing, then checks them all: it exits 1
# naming each program still missing and the package that provides it. Idempotent and
# non-interactive; a no-op on a machine that has them.
#
# Usage: install-deps.sh [--check | --packages] [PROFILE...]
#   demo   what `make demo` runs (a few small packages)
#   test   what `make test` runs: the stages unit, netns, vm and run, and the VM stage's guest kernel
#   bench  what `make bench*` runs: the stages bench, netns and run (the benches build meshes)
#   k8s    what tests/k8s and `make k8s-demo` run: the stages k8s, image and run
#   gen, image, or a stage's name (unit, netns, vm, run)
#   none   demo test bench
#   --check     install nothing; exit 1 naming each missing program and its package
#   --packages  print the apt packages of the profiles (installed or not) and exit
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
list=$here/deps.list

mode=install
case ${1:-} in
--check) mode=check; shift ;;
--packages) mode=packages; shift ;;
esac
profiles=("$@")
[ ${#profiles[@]} -gt 0 ] || profiles=(demo test bench)

selected=" "
kernel=0
for p in "${profiles[@]}"; do
	case $p in
	test) selected+="unit netns vm run "; kernel=1 ;;
	bench) selected+="bench netns run " ;;
	k8s) selected+="k8s image run " ;;
	vm) selected+="vm "; kernel=1 ;;
	demo | unit | netns | run | gen | image) selected+="$p " ;;
	*)
		echo "install-deps: unknown profile '$p' (want demo, test, bench, k8s, gen, image, or a stage: unit, netns, vm, run)" >&2
		exit 2
		;;
	esac
done

# entries [all]: the list's entries for the selected stages, as "NAME PACKAGE KIND" lines; only
# the missing ones unless the argument is "all". Optional programs (not packaged) are left out.
entries() {
	local name pkg stages kind s want
	while read -r name pkg stages kind; do
		case $name in '' | \#*) continue ;; esac
		kind=${kind:-apt}
		[ "$kind" != optional ] || continue
		want=0
		for s in ${stages//,/ }; do
			case $selected in *" $s "*) want=1 ;; esac
		done
		[ $want = 1 ] || continue
		if [ "${1:-}" != all ]; then
			if [[ $name == /* ]]; then
				[ ! -e "$name" ] || continue
			else
				! command -v "$name" >/dev/null 2>&1 || continue
			fi
		fi
		echo "$name $pkg $kind"
	done <"$list"
}

packages() { awk '$2 != "-" {print $2}' | LC_ALL=C sort -u; }

if [ $mode = packages ]; then
	entries all | packages
	exit 0
fi

missing=$(entries)
if [ -n "$missing" ] && [ $mode = install ]; then
	mapfile -t need < <(packages <<<"$missing")
	if [ ${#need[@]} -gt 0 ]; then
		if [ "$(id -u)" -ne 0 ]; then
			echo "install-deps: missing packages ${need[*]}; run as root (or install them) to continue" >&2
			exit 1
		fi
		echo "install-deps: installing ${need[*]} (for ${profiles[*]})" >&2
		export DEBIAN_FRONTEND=noninteractive
		apt=(apt-get -qq -o DPkg::Lock::Timeout=600)
		# The package lists there are usually do; refresh them only when the install fails
		# (a fresh machine without lists, or stale ones).
		if ! "${apt[@]}" install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1; then
			"${apt[@]}" update
			"${apt[@]}" install -y --no-install-recommends "${need[@]}" >/dev/null
		fi
	fi
	missing=$(entries)
fi
if [ -n "$missing" ]; then
	echo "install-deps: missing for ${profiles[*]}:" >&2
	while read -r name pkg kind; do
		if [ "$pkg" = - ]; then
			echo "  $name ($kind: not an apt package, install it by hand)" >&2
		else
			echo "  $name (package $pkg)" >&2
		fi
	done <<<"$missing"
	echo "install them with: sudo $here/install-deps.sh ${profiles[*]}" >&2
	exit 1
fi

# The guest kernel of the VM stage: Debian's linux-image-amd64, unpacked (not installed) under
# /var/lib/cablemesh/vm-kernel; a no-op when one is there.
if [ $kernel = 1 ] && [ $mode = install ]; then
	"$here/vm/install-kernel.sh"
fi
