#!/usr/bin/env bash
# Unpacks the guest kernel of the VM tests (tests/vm): Debian's current linux-image-amd64 (its
# bzImage and its modules, which include wireguard.ko, esp4.ko and the xfrm modules) under
# /var/lib/cablemesh/vm-kernel/<release>/ (or $CABLEMESH_VM_KERNEL_DIR), then runs depmod there.
#
# The package is downloaded with apt and unpacked with dpkg-deb, not installed: the host's /boot
# and /lib/modules, its initramfs hooks and its boot loader stay as they are, and nothing it
# depends on (initramfs-tools, udev, a systemd upgrade) comes along. Needs kmod (depmod).
# Idempotent: a no-op when a kernel is already unpacked there.
set -euo pipefail

dir=${CABLEMESH_VM_KERNEL_DIR:-/var/lib/cablemesh/vm-kernel}

for k in "$dir"/*/; do
	rel=$(basename "$k")
	if [ -e "$k/boot/vmlinuz-$rel" ] && [ -e "$k/lib/modules/$rel/modules.dep" ]; then
		exit 0
	fi
done

if [ "$(id -u)" -ne 0 ]; then
	echo "install-kernel: no guest kernel under $dir; run as root to unpack one" >&2
	exit 1
fi
command -v depmod >/dev/null 2>&1 || { echo "install-kernel: depmod missing (apt-get install kmod)" >&2; exit 1; }

# The metapackage names the current ABI's image package, e.g. linux-image-6.1.0-56-amd64.
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [ -z "$pkg" ]; then
	apt-get update -qq
	pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[ -n "$pkg" ] || { echo "install-kernel: apt knows no linux-image-amd64" >&2; exit 1; }
rel=${pkg#linux-image-}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt's download sandbox user must be able to write the directory.
chmod 0755 "$tmp"
chown _apt "$tmp" 2>/dev/null || true
echo "install-kernel: unpacking $pkg into $dir/$rel" >&2
(cd "$tmp" && apt-get download -qq "$pkg")
mkdir -p "$dir"
rm -rf "$dir/$rel.partial"
dpkg-deb -x "$tmp"/"$pkg"_*.deb "$dir/$rel.partial"
depmod -b "$dir/$rel.partial" "$rel"
rm -rf "${dir:?}/$rel"
mv "$dir/$rel.partial" "$dir/$rel"
echo "install-kernel: $dir/$rel/boot/vmlinuz-$rel" >&2
