#!/usr/bin/env bash
# Builds the OCI images of cable-agent, cable-broker and cablectl (`make image`): each is one
# static Go binary (CGO_ENABLED=0) at / on an empty base (buildah from scratch), so the build
# needs no registry and runs offline. The images are committed to buildah's local storage as
# $IMAGE_REPO/<binary>:$IMAGE_TAG (default cablemesh/...:v0.1.0, the names deploy/ uses) and,
# with IMAGE_ARCHIVE_DIR set, also written there as OCI archives for `ctr image import` or
# `kind load image-archive`.
# Not in the images: strongSwan's charon (the ipsec cable driver) and Envoy (its own image).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
repo=${IMAGE_REPO:-cablemesh}
tag=${IMAGE_TAG:-v0.1.0}
archives=${IMAGE_ARCHIVE_DIR:-}
go=${GO:-go}
command -v buildah >/dev/null || { echo "image: buildah is not installed (Debian: apt-get install buildah)" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$root"
CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w -X github.com/cablemesh/cablemesh/internal/version.Version=$tag" \
	-o "$out/" ./cmd/cable-agent ./cmd/cable-broker ./cmd/cablectl

# buildah from scratch runs nothing inside the image: vfs storage and chroot isolation work in
# containers without overlayfs or user namespaces, as on CI machines.
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
for b in cable-agent cable-broker cablectl; do
	ctr=$(buildah from scratch)
	buildah copy --chmod 0755 "$ctr" "$out/$b" "/$b" >/dev/null
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
