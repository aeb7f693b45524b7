#!/usr/bin/env bash
# Builds CoreDNS (github.com/coredns/coredns, the version go.mod here requires, with the plugins
# main.go imports) or reuses an earlier build, cached outside the work tree like the Kubernetes
# binaries of ../build.sh:
#   $COREDNS_CACHE_DIR/<coredns version>/<first 16 hex digits of sha256(go.sum + main.go)>/
#       coredns       the static binary (CGO_ENABLED=0)
#       coredns.tar   with `image`: a docker-archive of the image docker.io/cablemesh/coredns:<version>
#                     (the binary at /coredns on an empty base, built with buildah), which the
#                     nodes of tests/k8s/cluster.sh import with ctr
# (default COREDNS_CACHE_DIR=/var/cache/cablemesh/coredns). Each file lands whole (written to a
# temporary name, then renamed), and builds are serialised by a lock.
#
#   build.sh          prints the directory holding coredns
#   build.sh image    also makes coredns.tar; prints the directory
#
# A cold build takes about 3 minutes on 2 idle cores (under nice 19); warm: instant.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
go=${GO:-go}
cache_root=${COREDNS_CACHE_DIR:-/var/cache/cablemesh/coredns}
want_image=false
case ${1:-} in
"") ;;
image) want_image=true ;;
*) echo "coredns-build: unknown argument '$1' (want nothing or 'image')" >&2; exit 2 ;;
esac

log() { echo "coredns-build: $*" >&2; }
die() { log "$*"; exit 1; }
command -v "$go" >/dev/null || die "go ('$go') is not installed"

cd "$here"
version=$("$go" list -mod=readonly -m -f '{{.Version}}' github.com/coredns/coredns) ||
	die "cannot read the github.com/coredns/coredns version from $here/go.mod"
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "unexpected github.com/coredns/coredns version '$version'"
sum=$(cat go.sum main.go | sha256sum | cut -c1-16)
dir=$cache_root/$version/$sum
image=docker.io/cablemesh/coredns:$version

complete() { [[ -x $dir/coredns ]] && { ! $want_image || [[ -s $dir/coredns.tar ]]; }; }
if complete; then
	log "reusing $dir"
	echo "$dir"
	exit 0
fi
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if ! [[ -x $dir/coredns ]]; then
	log "building CoreDNS $version into $dir (nice 19; about 3 minutes cold)"
	start=$SECONDS
	CGO_ENABLED=0 nice -n 19 "$go" build -mod=readonly -trimpath \
		-ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$version" -o "$dir/coredns.tmp" .
	mv -f "$dir/coredns.tmp" "$dir/coredns"
	log "built in $((SECONDS - start)) s"
fi
if $want_image && ! [[ -s $dir/coredns.tar ]]; then
	command -v buildah >/dev/null || die "buildah is not installed (Debian: apt-get install buildah)"
	# As scripts/image.sh: from scratch, so nothing runs inside the image while it is built.
	export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
	ctr=$(buildah from scratch)
	trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
	buildah copy --chmod 0755 "$ctr" "$dir/coredns" /coredns >/dev/null
	buildah config --entrypoint '["/coredns"]' --cmd '' \
		--label org.opencontainers.image.title=coredns \
		--label org.opencontainers.image.version="$version" \
		--label org.opencontainers.image.source=https://github.com/coredns/coredns "$ctr"
	rm -f "$dir/coredns.tar.tmp"
	# A docker-archive keeps the full repo tag, under which the CRI looks the image up.
	buildah commit --quiet "$ctr" "docker-archive:$dir/coredns.tar.tmp:$image" >/dev/null
	mv -f "$dir/coredns.tar.tmp" "$dir/coredns.tar"
	log "image $image in $dir/coredns.tar"
fi
echo "$dir"
