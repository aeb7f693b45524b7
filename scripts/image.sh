#!/usr/bin/env bash
# Builds the OCI images of cable-agent, cable-broker and cablectl (`make image`): each is one
# static Go binary (CGO_ENABLED=0) at / on an empty base (buildah from scratch), so the build
# needs no registry and runs offline. The images are committed to buildah's local storage as
# $IMAGE_REPO/<binary>:$IMAGE_TAG (default cablemesh/...:v0.1.0, the names deploy/ uses) and,
# with IMAGE_ARCHIVE_DIR set, also written there as OCI archives for `ctr image import` or
# `kind load image-archive`.
# The cable-agent image also carries strongSwan's charon for the ipsec cable driver, copied from
# this machine's Debian packages (charon_rootfs below; docs/ipsec-kubernetes.md says why one image
# and what the pod needs). Not in the images: Envoy (its own image).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
repo=${IMAGE_REPO:-cablemesh}
tag=${IMAGE_TAG:-v0.1.0}
archives=${IMAGE_ARCHIVE_DIR:-}
go=${GO:-go}
command -v buildah >/dev/null || { echo "image: buildah is not installed (Debian: apt-get install buildah)" >&2; exit 1; }

# What the ipsec driver's charon needs in the agent's image: the driver starts it with
# `/bin/sh -c 'mount -t tmpfs tmpfs /run; charon &'` (cable/ipsec/charon.go) and charon loads
# exactly these plugins (cable/ipsec/conf.go); ESP in the kernel (kernel-netlink) or in charon
# (kernel-libipsec, where the kernel has none) is chosen at run time, so both are there.
IPSEC_DIR=/usr/lib/ipsec
CHARON_PLUGINS=(random nonce openssl kdf kernel-libipsec kernel-netlink socket-default vici)

# charon_rootfs DIR: charon, its plugins, /bin/sh (dash) and mount, and every shared library
# they load (ldd, which follows the plugins' own dependencies), each at the path the dynamic
# loader looks for it, as regular files (symlinks followed: the image has no /lib -> usr/lib).
charon_rootfs() {
	local dir=$1 f lib elfs=()
	[[ -x $IPSEC_DIR/charon ]] || { echo "image: $IPSEC_DIR/charon is missing (Debian: apt-get install strongswan-charon; scripts/install-deps.sh image)" >&2; return 1; }
	elfs+=("$IPSEC_DIR/charon")
	for f in "${CHARON_PLUGINS[@]}"; do
		f=$IPSEC_DIR/plugins/libstrongswan-$f.so
		[[ -f $f ]] || { echo "image: $f is missing (cable/ipsec/DEPENDENCIES.md: which package)" >&2; return 1; }
		elfs+=("$f")
	done
	elfs+=(/bin/sh /bin/mount)
	for f in "${elfs[@]}"; do
		install -D -m 0755 "$(readlink -f "$f")" "$dir$f"
		# ldd prints "name => /path (addr)" per library and "/path (addr)" for the loader.
		for lib in $(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
			[[ -f $dir$lib ]] || install -D -m 0755 "$(readlink -f "$lib")" "$dir$lib"
		done
	done
	# glibc loads libgcc_s at run time (no ldd can see it) for pthread_cancel, which charon calls
	# when it stops: without it charon aborts on SIGTERM instead of removing its SAs and routes.
	lib=$(ldd /bin/sh | awk '$1 == "libc.so.6" {print $3}')
	lib=${lib%/*}/libgcc_s.so.1
	[[ -f $lib ]] || { echo "image: $lib is missing (Debian: libgcc-s1)" >&2; return 1; }
	install -D -m 0755 "$(readlink -f "$lib")" "$dir$lib"
	# /run is where the launcher mounts charon's private tmpfs; charon's pid file path is compiled
	# in as /var/run/charon.pid, which is /run's on Debian (charon exits when it cannot write it).
	mkdir -p "$dir/run" "$dir/var"
	ln -s /run "$dir/var/run"
	# Every library they need resolves inside DIR: their dynamic loader says so there (root only:
	# chroot), and charon runs.
	if [[ $(id -u) == 0 ]]; then
		local listing loader
		loader=$(ldd /bin/sh | awk '$1 ~ /^\// {print $1}')
		for f in "${elfs[@]}"; do
			if ! listing=$(chroot "$dir" "$loader" --list "$f" 2>&1) || [[ $listing == *"not found"* ]]; then
				echo "image: $f lacks a library inside the image's file tree: $listing" >&2
				return 1
			fi
		done
		# charon reads a strongswan.conf before it answers --version; the driver writes its own
		# (STRONGSWAN_CONF) at run time, so the image carries none.
		: >"$dir/check.conf"
		STRONGSWAN_CONF=/check.conf chroot "$dir" "$IPSEC_DIR/charon" --version >/dev/null ||
			{ echo "image: charon does not run inside the image's file tree" >&2; return 1; }
		rm -f "$dir/check.conf"
	fi
}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$root"
charon_rootfs "$out/charon-root"
CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w -X github.com/cablemesh/cablemesh/internal/version.Version=$tag" \
	-o "$out/" ./cmd/cable-agent ./cmd/cable-broker ./cmd/cablectl

# buildah from scratch runs nothing inside the image: vfs storage and chroot isolation work in
# containers without overlayfs or user namespaces, as on CI machines.
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
for b in cable-agent cable-broker cablectl; do
	ctr=$(buildah from scratch)
	buildah copy --chmod 0755 "$ctr" "$out/$b" "/$b" >/dev/null
	if [[ $b == cable-agent ]]; then
		buildah copy "$ctr" "$out/charon-root" / >/dev/null
	fi
	buildah config --entrypoint "[\"/$b\"]" --cmd '' \
		--label org.opencontainers.image.title="$b" \
		--label org.opencontainers.image.version="$tag" \
		--label org.opencontainers.image.source=https://github.com/cablemesh/cablemesh "$ctr"
	buildah commit --quiet "$ctr" "$repo/$b:$tag" >/dev/null
	buildah rm "$ctr" >/dev/null
	echo "built $repo/$b:$tag"
	if [[ -n $archives ]]; then
		mkdir -p "$archives"
		rm -f "$archives/$b.tar"
		buildah push --quiet "$repo/$b:$tag" "oci-archive:$archives/$b.tar:$repo/$b:$tag" >/dev/null
		echo "wrote $archives/$b.tar"
	fi
done
